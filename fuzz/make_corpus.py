#!/usr/bin/env python3
"""Writes the small seed corpus of the libFuzzer targets (fuzz/corpus/<target>/). Run once; the output is committed.
Seeds are valid inputs of each reader plus a few near misses; libFuzzer mutates from there."""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> safetensors bytes."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def write(target, name, blob):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(blob if isinstance(blob, bytes) else blob.encode())


def main():
    # safetensors: every dtype family, metadata, an empty file, a 0-dim tensor, a truncated file.
    many = safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f" * 3),
                        ("c", "U8", [4], bytes([1, 2, 3, 4])), ("d", "I64", [1], struct.pack("<q", -5)),
                        ("e", "BOOL", [2], b"\x01\x00"), ("f", "F16", [], b"\x00\x3c")], {"format": "pt"})
    write("safetensors", "many_dtypes", many)
    write("safetensors", "empty_header", safetensors([]))
    write("safetensors", "truncated", many[:-3])
    write("safetensors", "misaligned", safetensors([("x", "U8", [1], b"\x07"), ("y", "F32", [1], f32(2.5))]))

    # observation: pi0-infer's keys (see fuzz/observation.cpp for the model format).
    state = ("state", "F32", [1, 6], f32(0.1, -0.2, 0.3, 0.0, 1.5, -2.0))
    image = ("image/base_0_rgb", "U8", [1, 4, 6, 3], bytes(range(72)))
    tokens = ("tokenized_prompt", "I64", [1, 4], struct.pack("<4q", 2, 9, 17, 0))
    mask = ("tokenized_prompt_mask", "BOOL", [1, 4], b"\x01\x01\x01\x00")
    write("observation", "uint8_image", safetensors([state, image, tokens, mask]))
    float_image = ("image/left_wrist_0_rgb", "F32", [1, 2, 2, 3], f32(*[x / 6 - 1 for x in range(12)]))
    img_mask = ("image_mask/left_wrist_0_rgb", "BOOL", [1], b"\x00")
    write("observation", "float_image_mask", safetensors([state, float_image, img_mask, tokens, mask]))
    write("observation", "nan_state", safetensors([("state", "F32", [1, 2], f32(float("nan"), 1)), image, tokens, mask]))
    write("observation", "typo_key", safetensors([state, image, tokens, mask, ("image_mazk/base_0_rgb", "BOOL", [1], b"\x01")]))

    # config: a tiny pi0 config with overrides on "#set " lines.
    write("config", "tiny", "model: {type: pi0, paligemma_variant: dummy, action_expert_variant: dummy, "
          "siglip_variant: tiny/14, image_size: 28, action_dim: 8, action_horizon: 4}\n"
          "data:\n  dataset: {format: libero, paths: [x.hdf5], cameras: {base_0_rgb: agentview_rgb}}\n"
          "  norm_stats: stats.json\ntrain: {num_steps: 3, batch_size: 2, lr_warmup_steps: 1, precision: float32}\n"
          "#set train.lr=1e-4\n#set data.dataset.paths=[a.hdf5, b.hdf5]\n")
    write("config", "aloha_lora", "model: {type: pi05, paligemma_variant: gemma_2b_lora}\n"
          "data: {dataset: {format: aloha, prompt: fold, adapt_to_pi: auto}, delta_action_mask: [true, false]}\n"
          "train: {freeze: lora, ema_decay: 0.99}\ncheckpoint: {save_every: 10, keep: 2}\n#set model.lora_rank=8\n")
    write("config", "bad_key", "trian: {lr: 1}\n#set train.lr=abc\n")

    # config_alias: a "billion laughs" file (9 levels of 9 aliases: refused at once) and a real config sharing
    # values through anchors (read in full).
    laughs = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for level in "bcdefghi":
        prev = chr(ord(level) - 1)
        laughs += "%s: &%s [%s]\n" % (level, level, ", ".join(["*" + prev] * 9))
    write("config_alias", "billion_laughs", laughs)
    write("config_alias", "anchors", "model: {type: pi0, paligemma_variant: dummy, action_expert_variant: dummy, "
          "siglip_variant: tiny/14, image_size: 28, action_dim: &dim 8, action_horizon: *dim}\n"
          "data:\n  dataset: {format: libero, paths: &paths [x.hdf5, y.hdf5], "
          "cameras: {base_0_rgb: agentview_rgb}}\n"
          "  norm_stats: stats.json\n"
          "train: {num_steps: 3, batch_size: 2, lr_warmup_steps: 1, lr_peak: &lr 1.0e-4, lr_end: *lr, "
          "trainable_include: &inc [a, b], trainable_exclude: *inc}\n")

    # norm stats: openpi's file, with and without quantiles, and a shape mismatch.
    stats = {"norm_stats": {"state": {"mean": [0.1, 0.2], "std": [1.0, 0.5], "q01": [-1.0, -2.0], "q99": [1.0, 2.0]},
                            "actions": {"mean": [0.0], "std": [0.0]}}}
    write("norm_stats", "openpi", json.dumps(stats, indent=2))
    write("norm_stats", "no_quantiles", json.dumps({"norm_stats": {"state": {"mean": [1e300], "std": [1e-300]}}}))
    write("norm_stats", "mismatch", json.dumps({"norm_stats": {"state": {"mean": [0, 1], "std": [1]}}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
