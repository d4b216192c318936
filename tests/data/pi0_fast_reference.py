#!/usr/bin/env python3
"""Reference generator for pi0-FAST's tokenization (data::FastPrompt, tests/unit/data/test_fast_prompt.cpp, tag
[fast]): openpi's own FASTTokenizer.tokenize and .extract_actions, run on ~20 prompt/state/action cases and ~20
generated token rows. Writes tests/data/golden/pi0_fast/tokenize.json.

How openpi's code is run: src/openpi/models/tokenizer.py at the pinned commit below is read from the given checkout (a
bare git directory: `git show <commit>:<path>`; a work tree: the file, whose git blob hash must be the pinned commit's)
and executed as it is, with stub modules for what FASTTokenizer does not use or cannot reach offline:
  - `openpi.shared.download.maybe_download` returns the path of the SentencePiece model given with --spm (the project's
    shared fixture ../shared/fixtures/openpi/tokenizer_spm.model, vocabulary 793, byte fallback) instead of
    PaliGemma's tokenizer on GCS;
  - `transformers.AutoProcessor.from_pretrained` returns a FAST processor over the tokenizer fitted by
    tests/data/fast_reference.py in tests/data/golden/fast/tokenizer_a (H 9, D 4, scale 10, vocab 256). The processor
    is the FAST processor's __call__ and decode (hub physical-intelligence/fast, processing_action_tokenizer.py:
    UniversalActionProcessor) re-implemented on HF `tokenizers` + scipy as fast_reference.py does (the hub code itself
    is remote code, not on PyPI); its decode keeps the processor's try/except that turns any failure into zeros.
  - `orbax.checkpoint`, `jax` and `openpi.models.utils.fsq_tokenizer` are imported by tokenizer.py only for other
    tokenizers: empty modules.
FASTTokenizer's map into the vocabulary is `vocab_size() - 1 - 128 - id`, 664 - id with this SentencePiece model, so
FAST ids 0..255 land on ordinary word pieces 409..664 and extract_actions' text round trip (decode, split on
"Action: " and "|", strip, encode) is lossy exactly as with PaliGemma's tokenizer on tail ids.

Run (from the repository root; writes tests/data/golden/pi0_fast/tokenize.json, about 50 kB):
    python3 -m venv build/pi0fast_ref_venv
    build/pi0fast_ref_venv/bin/pip install numpy==1.26.4 scipy==1.15.3 tokenizers==0.21.1 sentencepiece==0.2.0
    build/pi0fast_ref_venv/bin/python tests/data/pi0_fast_reference.py \
        --openpi <openpi checkout or its .git> --spm ../shared/fixtures/openpi/tokenizer_spm.model
(the versions of openpi's uv.lock at the pinned commit.)
"""
import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import types

import numpy as np
import sentencepiece
import tokenizers
from scipy.fft import dct, idct
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden", "pi0_fast")
FAST_DIR = os.path.join(HERE, "golden", "fast", "tokenizer_a")
OPENPI_COMMIT = "15a9616a00943ada6c20a0f158e3adb39df2ccac"
TOKENIZER_PATH = "src/openpi/models/tokenizer.py"
TOKENIZER_BLOB = "8a4966d6298619e52c7ba53359ccbbb8ba0b8cf6"  # `git rev-parse <commit>:<path>`


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_openpi(openpi: str, path: str, blob: str) -> bytes:
    if os.path.exists(os.path.join(openpi, path)):
        data = open(os.path.join(openpi, path), "rb").read()
    else:  # a bare repository (or a .git directory): the file at the pinned commit
        data = subprocess.run(["git", "--git-dir", openpi, "show", f"{OPENPI_COMMIT}:{path}"],
                              check=True, capture_output=True).stdout
    if git_blob_id(data) != blob:
        sys.exit(f"{openpi}: {path} is not openpi's at {OPENPI_COMMIT} (blob {git_blob_id(data)}, expected {blob})")
    return data


class FastProcessor:
    """The FAST processor's __call__ / decode (UniversalActionProcessor), on HF tokenizers + scipy."""

    def __init__(self, folder):
        proc = json.load(open(os.path.join(folder, "processor_config.json")))
        self.bpe = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.scale, self.min_token = proc["scale"], proc["min_token"]
        self.time_horizon, self.action_dim = proc["time_horizon"], proc["action_dim"]

    def __call__(self, chunk):
        if chunk.ndim == 2:
            chunk = chunk[None]
        coeff = np.around(dct(chunk, axis=1, norm="ortho") * self.scale)
        return [self.bpe.encode("".join(map(chr, np.maximum(c.flatten() - self.min_token, 0).astype(int)))).ids
                for c in coeff]

    def decode(self, tokens, *, time_horizon=None, action_dim=None):
        h, d = time_horizon or self.time_horizon, action_dim or self.action_dim
        out = []
        for ids in tokens:
            try:
                c = np.array(list(map(ord, self.bpe.decode(ids)))) + self.min_token
                c = c.reshape(-1, d)
                assert c.shape == (h, d), c.shape
            except Exception:  # the processor prints the error and decodes zeros
                c = np.zeros((h, d))
            out.append(idct(c / self.scale, axis=0, norm="ortho"))
        return np.stack(out)


def load_openpi_tokenizer(source: bytes, spm_path: str):
    """openpi's tokenizer module, executed from its own source with the stubs of the docstring registered first."""
    for name in ("openpi", "openpi.shared", "openpi.models", "openpi.models.utils", "orbax", "jax"):
        sys.modules.setdefault(name, types.ModuleType(name))
    download = types.ModuleType("openpi.shared.download")
    download.maybe_download = lambda url, **kw: pathlib.Path(spm_path)
    sys.modules["openpi.shared.download"] = download
    sys.modules["openpi.shared"].download = download
    sys.modules["openpi.models.utils.fsq_tokenizer"] = types.ModuleType("openpi.models.utils.fsq_tokenizer")
    sys.modules["openpi.models.utils"].fsq_tokenizer = sys.modules["openpi.models.utils.fsq_tokenizer"]
    sys.modules["orbax.checkpoint"] = types.ModuleType("orbax.checkpoint")
    sys.modules["orbax"].checkpoint = sys.modules["orbax.checkpoint"]
    transformers = types.ModuleType("transformers")

    class AutoProcessor:
        @staticmethod
        def from_pretrained(path, trust_remote_code=False):
            assert trust_remote_code
            return FastProcessor(path)

    transformers.AutoProcessor = AutoProcessor
    sys.modules["transformers"] = transformers
    module = types.ModuleType("openpi.models.tokenizer")
    module.__file__ = TOKENIZER_PATH
    sys.modules[module.__name__] = module
    exec(compile(source, TOKENIZER_PATH, "exec"), module.__dict__)
    return module


def smooth(rng, h, d, amp=1.0):
    """A seeded smooth random walk [h, d] in [-1, 1] (times amp), 4 decimals (short, exact JSON)."""
    x = np.clip(rng.uniform(-0.7, 0.7, size=(1, d)) + np.cumsum(rng.normal(0.0, 0.08, size=(h, d)), axis=0), -1, 1)
    return np.round(x * amp, 4)


def tokenize_cases(rng, h, d):
    """(name, prompt, state, actions or None, max_len)."""
    s4 = lambda: np.round(rng.uniform(-1, 1, size=4), 4)
    cases = [
        ("plain", "pick up the red block", s4(), smooth(rng, h, d), 96),
        ("case_underscores_whitespace", "  Open_The_DRAWER\t ", s4(), smooth(rng, h, d), 96),
        ("newline_kept", "put the bowl\non the plate\n", s4(), smooth(rng, h, d), 96),
        ("only_whitespace_prompt", " \n\t ", s4(), smooth(rng, h, d), 96),
        ("empty_prompt", "", s4(), smooth(rng, h, d), 96),
        ("non_ascii", "Place the CRÈME BRÛLÉE on the Ωmega TRAY", s4(), smooth(rng, h, d), 160),
        ("special_casing", "İSTANBUL ΟΔΟΣ, ΣΟΦΙΑΣ. Ἀθῆναι ǅ", s4(), smooth(rng, h, d), 160),
        ("unicode_whitespace_strip", "\u00a0\u3000Stack the cups\u2003\u0085", s4(), smooth(rng, h, d), 96),
        ("state_bin_edges", "move left", np.array([-1.0, -0.9921875, 0.0, 0.9921875, 1.0, 0.99999, -0.0078125]),
         smooth(rng, h, d), 96),
        ("state_out_of_range", "move right", np.array([-1.5, 1.5, -1.0000001, 2.0, 1.0000001]), smooth(rng, h, d), 96),
        ("state_one_dim", "wave", np.array([0.3]), smooth(rng, h, d), 96),
        ("state_14_dims", "fold the towel", np.round(rng.uniform(-1.2, 1.2, size=14), 4), smooth(rng, h, d), 128),
        ("no_actions", "Pick up the RED block", s4(), None, 96),
        ("actions_zeros", "stay", s4(), np.zeros((h, d)), 96),
        ("actions_saturated", "push hard", s4(), np.where(np.arange(h)[:, None] % 2 == 0, 1.0, -1.0) * np.ones((h, d)),
         96),
        ("actions_out_of_range", "reach far", s4(), np.concatenate([smooth(rng, h, d - 1, 0.3), np.full((h, 1), 3.0)],
                                                                   axis=1), 96),
        ("actions_below_range", "reach back", s4(), np.concatenate([np.full((h, 1), -4.0), smooth(rng, h, d - 1)],
                                                                   axis=1), 96),
        ("truncated_in_postfix", "pick up the red block", s4(), smooth(rng, h, d), 40),
        ("truncated_in_prefix", "pick up the red block and put it in the green bowl", s4(), smooth(rng, h, d), 12),
        ("long_prompt", "pick up the red block and put it in the green bowl then close the drawer slowly", s4(),
         smooth(rng, h, d), 128),
        ("smooth_small", "insert the peg", s4(), smooth(rng, h, d, 0.2), 96),
    ]
    return cases


def find_round_trip_rows(rng, tk, spm, n_code_points, n_exact=4, n_lossy=2):
    """FAST id sequences that survive extract_actions' text round trip with this small SentencePiece model.

    Most FAST sequences do not: their pieces are ordinary words here, so decode + encode merges them differently and
    the ids leave the FAST range (which decodes to zeros; the postfix rows above show it). A seeded search keeps
    sequences of exactly n_code_points FAST code points whose round trip gives the same ids ("exact") or other ids that
    still decode to n_code_points code points ("lossy"), so that extract_actions' non-zero path is covered too."""
    bpe = tk._fast_tokenizer.bpe
    n_fast = bpe.get_vocab_size()
    exact, lossy = [], []
    for _ in range(200000):
        ids = []
        while len(bpe.decode(ids)) < n_code_points:
            ids.append(int(rng.integers(0, n_fast)))
        if len(bpe.decode(ids)) != n_code_points:
            continue
        back = [int(x) for x in tk._act_tokens_to_paligemma_tokens(
            spm.encode(spm.decode([int(x) for x in tk._act_tokens_to_paligemma_tokens(ids)]).strip()))]
        if not all(0 <= x < n_fast for x in back) or len(bpe.decode(back)) != n_code_points:
            continue
        if back == ids and len(exact) < n_exact:
            exact.append(ids)
        elif back != ids and len(lossy) < n_lossy:
            lossy.append(ids)
        if len(exact) == n_exact and len(lossy) == n_lossy:
            return exact, lossy
    raise RuntimeError(f"round-trip search found {len(exact)} exact and {len(lossy)} lossy rows")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openpi", required=True, help="openpi checkout (work tree at the pinned commit, or a .git)")
    parser.add_argument("--spm", required=True, help="the SentencePiece model (../shared/fixtures/openpi/tokenizer_spm.model)")
    args = parser.parse_args()
    tok_mod = load_openpi_tokenizer(read_openpi(args.openpi, TOKENIZER_PATH, TOKENIZER_BLOB), args.spm)
    proc = json.load(open(os.path.join(FAST_DIR, "processor_config.json")))
    h, d = proc["time_horizon"], proc["action_dim"]
    spm = sentencepiece.SentencePieceProcessor(model_file=args.spm)
    rng = np.random.default_rng(4505)

    out_tok = []
    rows = []  # generated rows for extract_actions, built from the postfixes below
    for name, prompt, state, actions, max_len in tokenize_cases(rng, h, d):
        openpi_tok = tok_mod.FASTTokenizer(max_len=max_len, fast_tokenizer_path=FAST_DIR)
        tokens, mask, ar, loss = openpi_tok.tokenize(prompt, state, actions)
        case = {"name": name, "prompt": prompt, "state": state.tolist(), "max_len": max_len,
                "tokens": tokens.astype(int).tolist(), "mask": mask.astype(bool).tolist(),
                "ar_mask": ar.astype(int).tolist(), "loss_mask": loss.astype(bool).tolist()}
        if actions is not None:
            case["actions"] = actions.flatten().tolist()
            case["fast_ids"] = openpi_tok._fast_tokenizer(actions[None])[0]
            post = [int(t) for t, a in zip(tokens, ar) if a == 1]
            if len(post) == len(spm.encode("Action: ")) + len(case["fast_ids"]) + 2 and len(rows) < 8:  # untruncated
                rows.append((f"postfix_of_{name}", post + [0] * 7))  # as sample_actions returns it: 0 after the end
        out_tok.append(case)

    # Generated rows for extract_actions: what sample_actions returns (tokens after the prefix, 0 after the end).
    tk = tok_mod.FASTTokenizer(max_len=96, fast_tokenizer_path=FAST_DIR)
    act_ids = spm.encode("Action: ")
    bar_eos = spm.encode("|", add_eos=True)
    pg = lambda ids: [int(x) for x in tk._act_tokens_to_paligemma_tokens(list(ids))]
    exact, lossy = find_round_trip_rows(rng, tk, spm, h * d)
    fast_pg = pg(exact[0])
    rows += [(f"decodable_round_trip_{i}", act_ids + pg(ids) + bar_eos + [0] * 3) for i, ids in enumerate(exact)]
    rows += [(f"decodable_lossy_round_trip_{i}", act_ids + pg(ids) + bar_eos) for i, ids in enumerate(lossy)]
    rows += [
        ("no_action_marker", fast_pg + bar_eos + [0] * 4),
        ("all_padding", [0] * 16),
        ("only_eos", [1] + [0] * 8),
        ("no_bar", act_ids + fast_pg + [1]),
        ("no_bar_no_eos_max_steps", act_ids + fast_pg),
        ("one_fast_id_dropped", act_ids + fast_pg[:-1] + bar_eos),
        ("one_fast_id_repeated", act_ids + fast_pg + fast_pg[-1:] + bar_eos),
        ("text_after_bar", act_ids + fast_pg + spm.encode("| the end") + [1]),
        ("tokens_after_eos", act_ids + fast_pg + bar_eos + [int(x) for x in rng.integers(3, 793, size=5)]),
        ("two_action_markers", act_ids + fast_pg[:3] + act_ids + fast_pg + bar_eos),
        ("text_before_marker", spm.encode("ok then ") + act_ids + fast_pg + bar_eos),
        ("random_fast_ids", act_ids + pg(rng.integers(0, 256, size=len(fast_pg))) + bar_eos),
        ("random_vocab_ids", act_ids + [int(x) for x in rng.integers(3, 793, size=12)] + bar_eos),
        ("byte_pieces", act_ids + fast_pg[:4] + [4 + 0xC3, 4 + 0xA9] + fast_pg[4:] + bar_eos),
        ("bos_inside", [2] + act_ids + fast_pg + bar_eos),
    ]
    out_ext = []
    for name, row in rows:
        text = spm.decode(row)
        got = tk.extract_actions(np.asarray(row), h, d)
        case = {"name": name, "tokens": row, "text": text, "actions": np.asarray(got, dtype=np.float64).flatten().tolist()}
        if "Action: " in text:
            raw = spm.encode(text.split("Action: ")[1].split("|")[0].strip())
            case["reencoded"] = raw
            case["fast_ids"] = pg(raw)
        out_ext.append(case)

    result = {
        "what": "openpi FASTTokenizer.tokenize (tokens, masks) and extract_actions (actions [h*d], float64) by "
                "openpi's own tokenizer.py; text, reencoded, fast_ids are extract_actions' intermediate stages "
                "recomputed here for diagnosis",
        "openpi_commit": OPENPI_COMMIT, "openpi_file": TOKENIZER_PATH, "openpi_blob": TOKENIZER_BLOB,
        "versions": {"numpy": np.__version__, "sentencepiece": sentencepiece.__version__,
                     "tokenizers": tokenizers.__version__, "scipy": __import__("scipy").__version__},
        "spm_model": "tokenizer_spm.model (../shared/fixtures/openpi)",
        "spm_sha256": hashlib.sha256(open(args.spm, "rb").read()).hexdigest(),
        "spm_vocab": spm.vocab_size(), "eos_id": spm.eos_id(),
        "fast_tokenizer": "../fast/tokenizer_a", "h": h, "d": d,
        "regenerate": "see tests/data/pi0_fast_reference.py's docstring",
        "tokenize": out_tok, "extract": out_ext,
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "tokenize.json")
    with tempfile.NamedTemporaryFile("w", dir=OUT, delete=False, suffix=".tmp", encoding="utf-8") as f:
        f.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")).replace('},{"name"', '},\n{"name"') + "\n")
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)
    n_zero = sum(not any(c["actions"]) for c in out_ext)
    print(f"wrote {path}: {len(out_tok)} tokenize cases, {len(out_ext)} extract rows ({n_zero} zeros)")


if __name__ == "__main__":
    main()
