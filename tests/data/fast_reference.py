#!/usr/bin/env python3
"""Reference generator for data::FastTokenizer (tests/unit/data/test_fast_tokenizer.cpp, tag [fast]).

Fits two small FAST action tokenizers the way the FAST processor's `UniversalActionProcessor.fit` does
(physical-intelligence/fast, processing_action_tokenizer.py: DCT-II over time, x scale, round half to even,
code points minus min_token, then HF `tokenizers`' BpeTrainer on a ByteLevelBPETokenizer with the whole code-point
range as initial alphabet), saves them as the processor saves them (tokenizer.json + processor_config.json +
tokenizer_config.json), and writes encode/decode cases computed with HF `tokenizers` + scipy, exactly as the
processor's __call__ and decode compute them. Only facts are taken from upstream; this file re-implements them.

Run (from the repository root; writes tests/data/golden/fast/, about 0.6 MB):
    python3 -m venv /tmp/fastref_venv
    /tmp/fastref_venv/bin/pip install tokenizers==0.21.1 scipy==1.14.1 numpy==2.1.3
    /tmp/fastref_venv/bin/python tests/data/fast_reference.py

Tokenizer "a": H 9, D 4, scale 10, vocab 256, action_dim/time_horizon set, merges saved as "a b" strings (the format of
tokenizers < 0.20). With H = 9 the DC coefficient of a constant chunk of +-0.25 or +-0.75 is exactly +-0.75 or +-2.25 in
scipy's arithmetic (checked below), so x 10 gives exact .5 ties: 7.5 -> 8 but 22.5 -> 22 (round half to even).
Tokenizer "b": H 10, D 7 (LIBERO-like), scale 50, vocab 1024, action_dim/time_horizon null (as the released
tokenizer), merges saved as ["a", "b"] pairs (tokenizers >= 0.20). Scale 50 spreads code points over 0..~330: ASCII,
C1 controls (U+0085 is \\s), Latin-1 letters/digits/symbols and Latin Extended, i.e. multi-byte UTF-8 and category
boundaries in the GPT-2 split.
"""
import json
import os
import sys

import numpy as np
from scipy.fft import dct, idct
from tokenizers import ByteLevelBPETokenizer, Tokenizer
from tokenizers.trainers import BpeTrainer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "fast")


def smooth_chunks(rng, n, h, d):
    """Seeded smooth random walks in [-1, 1] with 4-decimal values (short, exact JSON)."""
    start = rng.uniform(-0.8, 0.8, size=(n, 1, d))
    steps = rng.normal(0.0, 0.08, size=(n, h, d))
    x = np.clip(start + np.cumsum(steps, axis=1), -1.0, 1.0)
    return np.round(x, 4)


def fit(chunks, scale, vocab_size):
    """UniversalActionProcessor.fit, re-implemented: returns (tokenizers.Tokenizer, min_token)."""
    coeffs = [dct(a, axis=0, norm="ortho").flatten() for a in chunks]
    allq = np.around(np.concatenate(coeffs) * scale)
    max_token, min_token = int(allq.max()), int(allq.min())
    assert max_token - min_token <= vocab_size

    def strings():
        for c in coeffs:
            yield "".join(map(chr, (np.around(c * scale) - min_token).astype(int)))

    bpe = ByteLevelBPETokenizer()
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[],
                         initial_alphabet=[chr(i) for i in range(max_token - min_token + 1)], max_token_length=10000)
    bpe._tokenizer.train_from_iterator(strings(), trainer=trainer)
    return bpe._tokenizer, min_token


def save(tok, folder, proc, string_merges):
    os.makedirs(folder, exist_ok=True)
    spec = json.loads(tok.to_str())
    if string_merges:  # the older format: "a b" (byte-level tokens never contain a space: it maps to U+0120)
        assert all(" " not in a and " " not in b for a, b in spec["model"]["merges"])
        spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(folder, "processor_config.json"), "w") as f:
        json.dump(proc, f, indent=2, sort_keys=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"clean_up_tokenization_spaces": False, "processor_class": "UniversalActionProcessor",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2, sort_keys=True)
    # The saved file must load back to the same tokenizer (both merges formats).
    again = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    assert again.get_vocab() == tok.get_vocab()
    return again


def quantize(a, scale):
    return np.around(dct(a, axis=0, norm="ortho") * scale)


def near_tie(a, scale):
    """True when some scaled coefficient lies within 1e-9 of a .5 boundary without being an exact tie: its rounding
    would then hang on the last bits of the DCT, which differ between FFT-based and matrix implementations."""
    v = dct(a, axis=0, norm="ortho") * scale
    frac = np.abs(v - np.floor(v) - 0.5)
    return bool(np.any((frac < 1e-9) & (frac != 0.0)))


def encode(tok, a, scale, min_token):
    """UniversalActionProcessor.__call__ for one chunk: returns (q, code points, string, ids)."""
    q = quantize(a, scale)
    cps = np.maximum(q.flatten() - min_token, 0).astype(int)
    s = "".join(map(chr, cps))
    return q, cps, s, tok.encode(s).ids


def decode(tok, ids, h, d, scale, min_token):
    """UniversalActionProcessor.decode for one sequence: returns (actions [h, d], decodable, number of code points)."""
    try:
        text = tok.decode(ids)
    except OverflowError:  # a negative id: the processor's try/except turns it into zeros
        return np.zeros((h, d)), False, -1
    c = np.array(list(map(ord, text))) + min_token
    n = int(c.size)
    try:
        c = c.reshape(-1, d)
        assert c.shape == (h, d)
    except Exception:
        c = np.zeros((h, d))
        return idct(c / scale, axis=0, norm="ortho"), False, n
    return idct(c / scale, axis=0, norm="ortho"), True, n


def split_lengths(tok, s):
    """Pre-tokenizer pieces as lengths in code points of the original string."""
    return [e - b for _, (b, e) in tok.pre_tokenizer.pre_tokenize_str(s)]


def make_cases(rng, tok, h, d, scale, min_token, ties):
    vocab = tok.get_vocab()
    inv = {i: t for t, i in vocab.items()}
    cases = []

    def add_encode(kind, a, with_dct=False):
        q, cps, s, ids = encode(tok, a, scale, min_token)
        actions, ok, n = decode(tok, ids, h, d, scale, min_token)
        case = {"kind": kind, "actions": a.flatten().tolist(), "q": q.astype(int).flatten().tolist(),
                "code_points": cps.tolist(), "splits": split_lengths(tok, s), "ids": ids,
                "decodable": ok, "n_code_points": n, "decoded": actions.flatten().tolist()}
        if with_dct:
            case["dct"] = dct(a, axis=0, norm="ortho").flatten().tolist()
        cases.append(case)
        return ids

    def add_decode(kind, ids):
        actions, ok, n = decode(tok, ids, h, d, scale, min_token)
        cases.append({"kind": kind, "ids": ids, "decodable": ok, "n_code_points": n,
                      "decoded": actions.flatten().tolist()})

    # In-range smooth chunks (resampled away from near-ties; see near_tie).
    encoded = []
    while len(encoded) < 100:
        a = smooth_chunks(rng, 1, h, d)[0]
        if near_tie(a, scale):
            continue
        encoded.append(add_encode("smooth", a, with_dct=len(encoded) < 20))
    add_encode("zeros", np.zeros((h, d)), True)
    for v in (0.25, -0.5, 0.9):
        add_encode("constant", np.full((h, d), v), True)
    for v in (1.0, -1.0):
        add_encode("saturated", np.full((h, d), v))
    add_encode("saturated_alternating", np.where(np.arange(h)[:, None] % 2 == 0, 1.0, -1.0) * np.ones((h, d)))
    add_encode("saturated_step", np.where(np.arange(h)[:, None] < h // 2, -1.0, 1.0) * np.ones((h, d)))
    # Beyond the fitted range: code points past the fitted alphabet (their byte-level symbols are often not in the
    # vocabulary and are dropped silently) and below min_token (clamped to code point 0).
    for v in (2.0, 3.0, 6.0, -2.0, -4.0):
        a = np.round(smooth_chunks(rng, 1, h, d)[0] * 0.3, 4)
        a[:, rng.integers(d)] = v
        if not near_tie(a, scale):
            add_encode("out_of_range", a)
    a = np.round(smooth_chunks(rng, 1, h, d)[0] * 5.0, 4)
    if not near_tie(a, scale):
        add_encode("out_of_range_all", a)
    # Exact .5 ties after scaling (round half to even): constant chunks whose DC coefficient * scale is k + 0.5.
    for vals in ties:
        a = np.tile(np.array(vals, dtype=np.float64), (h, 1))
        v = dct(a, axis=0, norm="ortho") * scale
        assert np.all((v[0] - np.floor(v[0]) == 0.5) | (v[0] == 0.0)), v[0]
        add_encode("tie", a, True)
    # Decode-only cases: truncated / extended / corrupted id strings, random ids, empty, out-of-vocabulary ids,
    # a negative id, and lone continuation bytes (lossy UTF-8 gives U+FFFD).
    for ids in encoded[:6]:
        add_decode("truncated", ids[:-1])
        add_decode("extended", ids + ids[-1:])
    n_vocab = len(vocab)
    single = sorted(i for i, t in inv.items() if len(t) == 1)  # sorted: get_vocab() order varies between runs
    for ids in encoded[6:12]:
        j = int(rng.integers(len(ids)))
        add_decode("replaced", ids[:j] + [int(rng.choice(single))] + ids[j + 1:])
    for _ in range(12):
        add_decode("random", [int(x) for x in rng.integers(0, n_vocab, size=int(rng.integers(1, 3 * h * d // 2)))])
    add_decode("empty", [])
    add_decode("out_of_vocab", encoded[0][:3] + [n_vocab + 5] + encoded[0][3:])
    add_decode("negative", encoded[0][:2] + [-1] + encoded[0][2:])
    byte_ids = [vocab[t] for t in ("\u0100", "\u0142", "\u00c2", "\u0121") if t in vocab]  # bytes 0x00, 0xAD, 0xC2, 0x20
    add_decode("lossy_utf8", encoded[1][:4] + byte_ids + encoded[1][4:])
    return cases


def dct_cases(rng):
    out = []
    for h in (1, 2, 3, 10, 16, 50):
        x = rng.normal(size=(h, 2))
        out.append({"h": h, "d": 2, "x": x.flatten().tolist(), "dct": dct(x, axis=0, norm="ortho").flatten().tolist(),
                    "idct": idct(x, axis=0, norm="ortho").flatten().tolist()})
    return out


def sweep(tok):
    """GPT-2 split of every code point 0..4095 between fixed neighbours (letter, digit, space, mark, symbol)."""
    out = []
    for ctx in ("a", "1", " ", "\u0301", "!"):
        for start in range(0, 4096, 512):
            s = "".join(ctx + chr(c) for c in range(start, start + 512))
            out.append({"context": ctx, "first": start, "last": start + 511, "splits": split_lengths(tok, s)})
    return out


def main():
    rng = np.random.default_rng(45)
    os.makedirs(OUT, exist_ok=True)
    specs = {
        "a": dict(h=9, d=4, scale=10, vocab=256, string_merges=True, dims=True, n_fit=3000,
                  ties=[(0.25, 0.75, -0.25, -0.75), (0.75, -0.25, 0.0, 0.25)]),
        "b": dict(h=10, d=7, scale=50, vocab=1024, string_merges=False, dims=False, n_fit=3000, ties=[]),
    }
    for name, sp in specs.items():
        h, d = sp["h"], sp["d"]
        tok, min_token = fit(list(smooth_chunks(rng, sp["n_fit"], h, d)), sp["scale"], sp["vocab"])
        proc = {"action_dim": d if sp["dims"] else None, "min_token": min_token,
                "processor_class": "UniversalActionProcessor", "scale": sp["scale"],
                "time_horizon": h if sp["dims"] else None, "vocab_size": sp["vocab"]}
        folder = os.path.join(OUT, f"tokenizer_{name}")
        tok = save(tok, folder, proc, sp["string_merges"])
        cases = make_cases(rng, tok, h, d, sp["scale"], min_token, sp["ties"])
        with open(os.path.join(OUT, f"cases_{name}.json"), "w") as f:
            json.dump({"tokenizer": f"tokenizer_{name}", "h": h, "d": d, "scale": sp["scale"], "min_token": min_token,
                       "vocab_len": len(tok.get_vocab()), "cases": cases}, f, separators=(",", ":"))
        print(f"{name}: min_token {min_token}, vocab {len(tok.get_vocab())}, {len(cases)} cases, "
              f"{sum(not c['decodable'] for c in cases)} undecodable", file=sys.stderr)
    with open(os.path.join(OUT, "dct.json"), "w") as f:
        json.dump(dct_cases(rng), f, separators=(",", ":"))
    with open(os.path.join(OUT, "pretokenizer_sweep.json"), "w") as f:
        json.dump(sweep(Tokenizer.from_file(os.path.join(OUT, "tokenizer_a", "tokenizer.json"))), f,
                  separators=(",", ":"))


if __name__ == "__main__":
    main()
