"""openpi's learning-rate schedules, by openpi's own code, as the table tests/unit/train/test_lr_schedule.cpp checks
train::lr_at against (tests/data/golden/openpi_lr_schedules.json, committed next to this script).

  python tests/data/lr_schedules.py --openpi <openpi checkout or its .git> [--out tests/data/golden/openpi_lr_schedules.json]
  python tests/data/lr_schedules.py --check                           (imports only; prints the versions)

How openpi's code is run: src/openpi/training/optimizer.py at the pinned commit below is read from the given checkout
(a bare git directory: `git show <commit>:<path>`; a work tree: the file, whose git blob hash must be the pinned
commit's) and executed as it is, with one import shim: `openpi.shared.array_typing`, which it imports only for the
`at.PyTree` annotation of the optimizers, is a stub module (the real one pulls in jaxtyping, beartype and flax, none of
which a schedule touches). CosineDecaySchedule(...).create() and RsqrtDecaySchedule(...).create() then build the optax
schedules exactly as openpi's training does, and each is evaluated at every integer step twice: by jax in its default
float32 (as openpi trains: jax_enable_x64 off; one jnp.int32 step at a time as optax's count is), and with
jax_enable_x64 on (the same code in float64: openpi's schedule as a function, without float32's rounding).

Venv (CPU wheels, the versions of openpi's uv.lock at that commit):
  python3 -m venv build/openpi_lr_venv
  build/openpi_lr_venv/bin/pip install jax==0.5.3 jaxlib==0.5.3 optax==0.2.4 numpy==1.26.4 chex==0.1.90 \
      ml-dtypes==0.4.1 scipy==1.15.3 opt-einsum==3.4.0 absl-py==2.3.0 etils==1.12.2 toolz==1.0.0 \
      typing-extensions==4.13.2
openpi's source: e.g. `git clone https://github.com/Physical-Intelligence/openpi && git -C openpi checkout <commit>`.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import types

OPENPI_COMMIT = "15a9616a00943ada6c20a0f158e3adb39df2ccac"
OPTIMIZER_PATH = "src/openpi/training/optimizer.py"
# git's blob id of OPTIMIZER_PATH at OPENPI_COMMIT (`git rev-parse <commit>:<path>`): a work tree's file must match.
OPTIMIZER_BLOB = "1d1cc9d7e53656f671468054be45f09b97529b96"

# (name, schedule, parameters, last step evaluated). Small settings cover every branch at every step (warmup 0, a
# one-step decay, steps past the decay's end, end_lr 0); openpi's own defaults are evaluated through the warmup and the
# first part of the decay (every step; the table stays small). decay_steps == warmup_steps, which pi0-train accepts
# (the cosine then ends at once, as openpi's train_pytorch.py computes it), is refused by optax ("requires positive
# decay_steps"), so it has no row here.
SETTINGS = [
    ("cosine_small", "cosine", dict(warmup_steps=10, peak_lr=2.5e-5, decay_steps=100, decay_lr=2.5e-6), 130),
    ("cosine_no_warmup", "cosine", dict(warmup_steps=0, peak_lr=1e-4, decay_steps=40, decay_lr=0.0), 50),
    ("cosine_one_decay_step", "cosine", dict(warmup_steps=7, peak_lr=3e-4, decay_steps=8, decay_lr=3e-5), 20),
    ("cosine_openpi_default", "cosine", dict(warmup_steps=1000, peak_lr=2.5e-5, decay_steps=30000, decay_lr=2.5e-6), 1200),
    ("rsqrt_small", "rsqrt", dict(warmup_steps=10, peak_lr=5e-5, timescale=20.0), 200),
    ("rsqrt_no_warmup", "rsqrt", dict(warmup_steps=0, peak_lr=1e-3, timescale=1.0), 100),
    ("rsqrt_openpi_default", "rsqrt", dict(warmup_steps=1000, peak_lr=5e-5, timescale=10000.0), 1200),
]


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def read_optimizer_source(openpi: str) -> bytes:
    if os.path.exists(os.path.join(openpi, OPTIMIZER_PATH)):
        data = open(os.path.join(openpi, OPTIMIZER_PATH), "rb").read()
    else:  # a bare repository (or a .git directory): the file at the pinned commit
        data = subprocess.run(["git", "--git-dir", openpi, "show", f"{OPENPI_COMMIT}:{OPTIMIZER_PATH}"],
                              check=True, capture_output=True).stdout
    if git_blob_id(data) != OPTIMIZER_BLOB:
        sys.exit(f"{openpi}: {OPTIMIZER_PATH} is not openpi's at {OPENPI_COMMIT} (blob {git_blob_id(data)}, expected "
                 f"{OPTIMIZER_BLOB}): check out that commit")
    return data


def load_openpi_optimizer(source: bytes):
    """openpi's optimizer module, executed from its own source with the array_typing stub registered first."""
    import typing

    for name in ("openpi", "openpi.shared", "openpi.training"):
        sys.modules.setdefault(name, types.ModuleType(name))
    stub = types.ModuleType("openpi.shared.array_typing")
    stub.PyTree = typing.Any  # the only name optimizer.py uses (annotations of OptimizerConfig.create)
    sys.modules["openpi.shared.array_typing"] = stub
    sys.modules["openpi.shared"].array_typing = stub
    module = types.ModuleType("openpi.training.optimizer")
    module.__file__ = OPTIMIZER_PATH
    sys.modules[module.__name__] = module  # dataclasses look their module up while the classes are created
    exec(compile(source, OPTIMIZER_PATH, "exec"), module.__dict__)
    return module


def versions():
    import jax
    import numpy
    import optax

    return {"jax": jax.__version__, "optax": optax.__version__, "numpy": numpy.__version__,
            "jax_enable_x64": bool(jax.config.jax_enable_x64)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openpi", help="openpi checkout (work tree at the pinned commit, or a bare/.git directory)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "golden", "openpi_lr_schedules.json"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(versions()))
        return
    if not args.openpi:
        parser.error("--openpi is required (a checkout of Physical-Intelligence/openpi)")
    import jax.numpy as jnp
    import numpy as np

    optimizer = load_openpi_optimizer(read_optimizer_source(args.openpi))
    classes = {"cosine": optimizer.CosineDecaySchedule, "rsqrt": optimizer.RsqrtDecaySchedule}
    import jax

    tables = []
    for name, kind, params, last in SETTINGS:
        schedule = classes[kind](**params).create()
        lrs32 = [float(np.float32(schedule(jnp.int32(step)))) for step in range(last + 1)]
        assert all(np.float32(x) == x for x in lrs32)  # float32 values, written exactly (repr of the widened double)
        tables.append({"name": name, "schedule": kind, "params": params, "lr_float32": lrs32})
    # The same code in float64: openpi's schedules as functions, without float32's rounding (which in the warmup,
    # (init - peak) * frac + peak, cancels: up to ~1e-5 relative at its first steps, ulps of peak_lr absolute).
    jax.config.update("jax_enable_x64", True)
    for (name, kind, params, last), table in zip(SETTINGS, tables):
        schedule = classes[kind](**params).create()
        values = [schedule(jnp.int64(step)) for step in range(last + 1)]
        assert all(v.dtype == jnp.float64 for v in values), {v.dtype for v in values}
        table["lr"] = [float(v) for v in values]
    jax.config.update("jax_enable_x64", False)
    result = {
        "what": "learning rate at every step 0..len(lr)-1 of openpi's CosineDecaySchedule / RsqrtDecaySchedule "
                ".create(): lr with jax_enable_x64 (float64), lr_float32 as openpi trains (jax's default float32)",
        "openpi_commit": OPENPI_COMMIT,
        "openpi_file": OPTIMIZER_PATH,
        "openpi_blob": OPTIMIZER_BLOB,
        "versions": {k: v for k, v in versions().items() if k != "jax_enable_x64"},
        "regenerate": "python tests/data/lr_schedules.py --openpi <openpi checkout> (venv: the script's docstring)",
        "settings": tables,
    }
    out_dir = os.path.dirname(os.path.abspath(args.out))
    with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False, suffix=".tmp") as f:
        # One setting's learning rates on one line: the file stays small and reviewable.
        text = json.dumps(result, indent=1)
        for t in tables:
            for key in ("lr_float32", "lr"):
                text = text.replace(json.dumps(t[key], indent=1).replace("\n", "\n   "), json.dumps(t[key]), 1)
        f.write(text + "\n")
    os.chmod(f.name, 0o644)
    os.replace(f.name, args.out)
    print(f"wrote {args.out}: {sum(len(t['lr']) for t in tables)} steps over {len(tables)} settings")


if __name__ == "__main__":
    main()
