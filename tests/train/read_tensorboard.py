"""Reads a run directory's TensorBoard event files with TensorBoard's own readers and prints what they hold as JSON,
for tests/integration/test_tensorboard.cpp to compare with metrics.jsonl. Needs PyPI's `tensorboard` (the test makes
a venv with a pinned version) and pillow (a dependency of tensorboard) to decode the images.

usage: read_tensorboard.py DIR

Output:
  {"files": [{"name": ..., "file_version": "brain.Event:2",
              "scalars": [[tag, step, value], ...],            # every simple_value, in file order
              "images": [[tag, step, height, width, png_height, png_width], ...],
              "session_starts": [step, ...]}, ...],            # files in TensorBoard's order (by name)
   "accumulator": {"scalars": {tag: [[step, value], ...]},   # EventAccumulator over DIR: what TensorBoard shows
                   "images": {tag: [[step, height, width], ...]}}}
Each file is read by LegacyEventFileLoader (the raw Event protos; it stops at a truncated or corrupt record, as
TensorBoard does), so the test sees per file what was written there.
"""
import io
import json
import os
import sys

from PIL import Image
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2


def read_file(path):
    out = {"name": os.path.basename(path), "file_version": None, "scalars": [], "images": [], "session_starts": []}
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
        if event.HasField("file_version"):
            out["file_version"] = event.file_version
        if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
            out["session_starts"].append(event.step)
        for value in event.summary.value:
            kind = value.WhichOneof("value")
            if kind == "simple_value":
                out["scalars"].append([value.tag, event.step, value.simple_value])
            elif kind == "image":
                decoded = Image.open(io.BytesIO(value.image.encoded_image_string))
                decoded.load()
                out["images"].append([value.tag, event.step, value.image.height, value.image.width,
                                      decoded.height, decoded.width])
    return out


def main():
    run_dir = sys.argv[1]
    names = sorted(n for n in os.listdir(run_dir) if "tfevents" in n)
    files = [read_file(os.path.join(run_dir, n)) for n in names]
    acc = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
    acc.Reload()
    tags = acc.Tags()
    accumulated = {
        "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
        "images": {t: [[e.step, e.height, e.width] for e in acc.Images(t)] for t in tags["images"]},
    }
    json.dump({"files": files, "accumulator": accumulated}, sys.stdout)


if __name__ == "__main__":
    main()
