#!/usr/bin/env python3
"""Writes small LeRobot datasets (v2.0, v2.1, v3.0) for the tests and bench_loader, following the on-disk format of
LeRobot (shared/docs/lerobot-format.md): info.json templates, fixed-size-list (or plain list) vector columns,
struct<bytes, path> PNG image columns, per-episode or multi-episode MP4 files (AV1 through libsvtav1, or H.264 through
libx264, GOP 2 as LeRobot encodes), v3.0 episode metadata with global dataset_from_index and per-camera
from_timestamp offsets.

Content is a pure function of (episode, frame) so the C++ tests can compute what they must read back
(tests/unit/data/lerobot_test_util.h mirrors these formulas):
  state[d]  = 100 e + t + d/8          action[d] = -(100 e + t) - d/4
  image (png)   px[y,x,c] = (50 e + 7 t + 3 y + 5 x + 80 c) mod 256
  image (video) px[y,x,c] = level(e,t) + (y + x) // 8 + 10 c,  level = 20 + (37 e + 9 t) mod 160  (smooth: codec-friendly)
  task_index = e mod n_tasks,  task text = "pick up object {k}"
Needs pyarrow, numpy and av (tests create a venv under build/ with pinned versions).
"""
import argparse
import json
import os
import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CAMERAS = ["image", "wrist_image"]


def state_row(e, t, dim):
    return np.array([100 * e + t + d / 8 for d in range(dim)], dtype=np.float32)


def action_row(e, t, dim):
    return np.array([-(100 * e + t) - d / 4 for d in range(dim)], dtype=np.float32)


def png_pixels(e, t, h, w):
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    return ((50 * e + 7 * t + 3 * y + 5 * x + 80 * c) % 256).astype(np.uint8)


def video_pixels(e, t, h, w):
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    level = 20 + (37 * e + 9 * t) % 160
    return (level + (y + x) // 8 + 10 * c).clip(0, 255).astype(np.uint8)


def encode_png(rgb):
    """A plain RGB8 PNG (what LeRobot's PIL-written frames are)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def write_video(path, frames, fps, codec):
    import av
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with av.open(path, "w") as out:
        if codec == "av1":
            s = out.add_stream("libsvtav1", rate=fps, options={"g": "2", "crf": "10", "preset": "10"})
        else:
            s = out.add_stream("libx264", rate=fps, options={"g": "2", "crf": "0", "preset": "veryfast"})
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = "yuv420p"
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    # Duration as LeRobot's get_video_duration_in_s measures it (stream.duration * time_base).
    with av.open(path) as inp:
        st = inp.streams.video[0]
        return float(st.duration * st.time_base)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", choices=["v2.0", "v2.1", "v3.0"], required=True)
    ap.add_argument("--images", choices=["png", "av1", "h264"], required=True)
    ap.add_argument("--lengths", default="5,7,4,6,3", help="frames per episode")
    ap.add_argument("--size", type=int, default=16, help="image height = width")
    ap.add_argument("--fps", type=int, default=10)
    ap.add_argument("--state-dim", type=int, default=8)
    ap.add_argument("--action-dim", type=int, default=7)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--robot-type", default="panda", help="info.json robot_type (aloha: pi0-train converts as ALOHA)")
    ap.add_argument("--chunks-size", type=int, default=2, help="episodes (v2) or files (v3) per chunk folder")
    ap.add_argument("--episodes-per-file", type=int, default=2, help="v3.0 data files")
    ap.add_argument("--episodes-per-video", type=int, default=3, help="v3.0 video files")
    ap.add_argument("--list", choices=["fixed", "plain"], default="fixed", help="vector column type")
    ap.add_argument("--row-group", type=int, default=0, help="rows per parquet row group (0 = one per file)")
    a = ap.parse_args()

    lengths = [int(x) for x in a.lengths.split(",")]
    n_ep, fps, hw = len(lengths), a.fps, a.size
    v3 = a.version == "v3.0"
    video = a.images != "png"
    vec = (lambda n: pa.list_(pa.float32(), n)) if a.list == "fixed" else (lambda n: pa.list_(pa.float32()))
    tasks = [f"pick up object {k}" for k in range(a.tasks)]

    cam_feature = {"dtype": "video" if video else "image", "shape": [hw, hw, 3], "names": ["height", "width", "channel"]}
    if video:
        cam_feature["info"] = {"video.height": hw, "video.width": hw, "video.codec": a.images, "video.pix_fmt": "yuv420p",
                               "video.fps": fps, "video.channels": 3, "video.is_depth_map": False, "has_audio": False}
    features = {c: dict(cam_feature) for c in CAMERAS}
    features.update({
        "state": {"dtype": "float32", "shape": [a.state_dim], "names": ["state"]},
        "actions": {"dtype": "float32", "shape": [a.action_dim], "names": ["actions"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    })
    if v3:
        for k, f in features.items():
            if f["dtype"] != "video":
                f["fps"] = fps

    def episode_table(e, first_index):
        n = lengths[e]
        cols = {}
        if not video:
            img_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            for ci, c in enumerate(CAMERAS):
                cols[c] = pa.array([{"bytes": encode_png(png_pixels(e + 10 * ci, t, hw, hw)), "path": f"frame_{t:06d}.png"}
                                    for t in range(n)], type=img_type)
        cols["state"] = pa.array([state_row(e, t, a.state_dim) for t in range(n)], type=vec(a.state_dim))
        cols["actions"] = pa.array([action_row(e, t, a.action_dim) for t in range(n)], type=vec(a.action_dim))
        cols["timestamp"] = pa.array([np.float32(t / fps) for t in range(n)], type=pa.float32())
        cols["frame_index"] = pa.array(range(n), type=pa.int64())
        cols["episode_index"] = pa.array([e] * n, type=pa.int64())
        cols["index"] = pa.array(range(first_index, first_index + n), type=pa.int64())
        cols["task_index"] = pa.array([e % a.tasks] * n, type=pa.int64())
        return pa.table(cols)

    def write_parquet(path, table):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path, row_group_size=a.row_group or None)

    info = {"codebase_version": a.version, "robot_type": a.robot_type, "total_episodes": n_ep, "total_frames": sum(lengths),
            "total_tasks": a.tasks, "chunks_size": a.chunks_size, "fps": fps, "splits": {"train": f"0:{n_ep}"},
            "features": features}
    starts = np.cumsum([0] + lengths).tolist()
    os.makedirs(f"{a.out}/meta", exist_ok=True)

    if not v3:
        info.update({"total_videos": n_ep * len(CAMERAS) if video else 0, "total_chunks": (n_ep + a.chunks_size - 1) // a.chunks_size,
                     "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                     "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"})
        for e in range(n_ep):
            chunk = e // a.chunks_size
            write_parquet(f"{a.out}/data/chunk-{chunk:03d}/episode_{e:06d}.parquet", episode_table(e, starts[e]))
            if video:
                for ci, c in enumerate(CAMERAS):
                    write_video(f"{a.out}/videos/chunk-{chunk:03d}/{c}/episode_{e:06d}.mp4",
                                [video_pixels(e + 10 * ci, t, hw, hw) for t in range(lengths[e])], fps, a.images)
        with open(f"{a.out}/meta/episodes.jsonl", "w") as f:
            for e in range(n_ep):
                f.write(json.dumps({"episode_index": e, "tasks": [tasks[e % a.tasks]], "length": lengths[e]}) + "\n")
        with open(f"{a.out}/meta/tasks.jsonl", "w") as f:
            for k, t in enumerate(tasks):
                f.write(json.dumps({"task_index": k, "task": t}) + "\n")
        stats = {"state": {"mean": [0.0] * a.state_dim}}  # not read by pi0-train (it computes its own norm stats)
        if a.version == "v2.1":
            with open(f"{a.out}/meta/episodes_stats.jsonl", "w") as f:
                for e in range(n_ep):
                    f.write(json.dumps({"episode_index": e, "stats": stats}) + "\n")
        else:
            with open(f"{a.out}/meta/stats.json", "w") as f:
                json.dump(stats, f)
    else:
        info.update({"data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
                     "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                     "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"})

        def cursor(k):  # k-th file -> (chunk, file), wrapping file_index at chunks_size (update_chunk_file_indices)
            return k // a.chunks_size, k % a.chunks_size

        meta = {"episode_index": [], "tasks": [], "length": [], "data/chunk_index": [], "data/file_index": [],
                "dataset_from_index": [], "dataset_to_index": []}
        for c in CAMERAS:
            for s in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
                meta[f"videos/{c}/{s}"] = []
        for k in range(0, n_ep, a.episodes_per_file):
            eps = range(k, min(n_ep, k + a.episodes_per_file))
            chunk, file = cursor(k // a.episodes_per_file)
            write_parquet(f"{a.out}/data/chunk-{chunk:03d}/file-{file:03d}.parquet",
                          pa.concat_tables([episode_table(e, starts[e]) for e in eps]))
            for e in eps:
                meta["episode_index"].append(e)
                meta["tasks"].append([tasks[e % a.tasks]])
                meta["length"].append(lengths[e])
                meta["data/chunk_index"].append(chunk)
                meta["data/file_index"].append(file)
                meta["dataset_from_index"].append(starts[e])
                meta["dataset_to_index"].append(starts[e + 1])
        video_ref = {}
        for k in range(0, n_ep, a.episodes_per_video):
            eps = list(range(k, min(n_ep, k + a.episodes_per_video)))
            chunk, file = cursor(k // a.episodes_per_video)
            for ci, c in enumerate(CAMERAS):
                if video:
                    frames = [video_pixels(e + 10 * ci, t, hw, hw) for e in eps for t in range(lengths[e])]
                    write_video(f"{a.out}/videos/{c}/chunk-{chunk:03d}/file-{file:03d}.mp4", frames, fps, a.images)
                offset = 0.0
                for e in eps:  # running sum of the episodes' durations before it in the file
                    video_ref[(e, c)] = (chunk, file, offset, offset + lengths[e] / fps)
                    offset += lengths[e] / fps
        for e in range(n_ep):
            for c in CAMERAS:
                chunk, file, t0, t1 = video_ref[(e, c)]
                meta[f"videos/{c}/chunk_index"].append(chunk)
                meta[f"videos/{c}/file_index"].append(file)
                meta[f"videos/{c}/from_timestamp"].append(t0)
                meta[f"videos/{c}/to_timestamp"].append(t1)
        if not video:
            meta = {k: v for k, v in meta.items() if not k.startswith("videos/")}
        meta["meta/episodes/chunk_index"] = [0] * n_ep
        meta["meta/episodes/file_index"] = [0] * n_ep
        write_parquet(f"{a.out}/meta/episodes/chunk-000/file-000.parquet", pa.table(meta))
        tt = pa.table({"task_index": pa.array(range(a.tasks), type=pa.int64()), "task": pa.array(tasks)})
        pq.write_table(tt, f"{a.out}/meta/tasks.parquet")
        with open(f"{a.out}/meta/stats.json", "w") as f:
            json.dump({"state": {"mean": [0.0] * a.state_dim}}, f)

    with open(f"{a.out}/meta/info.json", "w") as f:
        json.dump(info, f, indent=4)


if __name__ == "__main__":
    main()
