#!/usr/bin/env python3
"""LeRobot's own Python loader on a local dataset: random-access LeRobotDataset.__getitem__ with a 50-step action
chunk (delta_timestamps, as openpi asks for it), in the main process and through a torch DataLoader with N worker
processes. Prints one markdown row per mode: wall samples/s and samples per CPU-second (user + sys of this process
and its reaped worker processes), the per-core figure comparable with bench_loader's.
Run by scripts/bench_lerobot.sh inside its venv (pinned lerobot); not a test and not needed by the C++ product."""
import argparse
import os
import resource
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local dataset: never ask the Hub

import torch  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402


def cpu_seconds():
    """User + system CPU of this process and of its waited-for children (DataLoader workers once joined)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        u = resource.getrusage(who)
        total += u.ru_utime + u.ru_stime
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--samples", type=int, default=160, help="timed samples per mode")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--horizon", type=int, default=50)
    p.add_argument("--action-key", default="actions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--video-backend", default="auto",
                   help="torchcodec, pyav, or auto: torchcodec (LeRobot's default) where its FFmpeg libraries load, "
                        "else pyav (bundles its own FFmpeg; torchcodec 0.10 on Debian bookworm lacks libavdevice59)")
    a = p.parse_args()
    torch.set_num_threads(1)  # like bench_loader (torch threads 1): parallelism comes from the workers only

    backend = a.video_backend
    if backend == "auto":
        try:
            import torchcodec.decoders  # noqa: F401  (raises when no FFmpeg it supports loads)
            backend = "torchcodec"
        except (ImportError, OSError, RuntimeError):
            backend = "pyav"
    probe = LeRobotDataset("local/bench", root=a.root, video_backend=backend)
    fps = probe.meta.fps
    delta = {a.action_key: [t / fps for t in range(a.horizon)]}
    ds = LeRobotDataset("local/bench", root=a.root, delta_timestamps=delta, video_backend=backend)
    what = f"LeRobot {probe.meta.info['codebase_version']}" + (f" ({backend})" if probe.meta.video_keys else "")
    g = torch.Generator().manual_seed(a.seed)

    # Main process: plain random-access __getitem__ over a seeded permutation (one warm-up sample untimed).
    order = torch.randperm(len(ds), generator=g).tolist()
    ds[order[-1]]
    n = min(a.samples, len(ds))
    c0, t0 = cpu_seconds(), time.perf_counter()
    for i in order[:n]:
        ds[i]
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    print(f"| {a.label} | {what} __getitem__, main process | {n} | "
          f"{n / wall:.1f} | {cpu:.2f} | {n / cpu:.1f} |", flush=True)

    # DataLoader with worker processes, shuffled; CPU time includes the workers (joined when the iterator ends), so
    # their start-up is counted too: the first batch is not excluded from CPU time, only from wall time.
    batches = max(1, a.samples // a.batch_size)
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                                         generator=g, persistent_workers=False, prefetch_factor=4)
    c0 = cpu_seconds()
    it = iter(loader)
    next(it)  # warm-up: workers started, first batch built
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    wall = time.perf_counter() - t0
    del it  # shuts the workers down and joins them, so RUSAGE_CHILDREN holds their CPU time
    cpu = cpu_seconds() - c0
    m = batches * a.batch_size
    print(f"| {a.label} | {what} DataLoader, {a.workers} worker processes | {m} | {m / wall:.1f} | {cpu:.2f} | "
          f"{(m + a.batch_size) / cpu:.1f} |", flush=True)


if __name__ == "__main__":
    main()
