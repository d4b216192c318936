#!/usr/bin/env python3
"""Reference generator for knowledge insulation (Pi0Impl::compute_ki_loss; tests/unit/model/test_ki.cpp, tag
[parity][ki]; acceptance tests A10, A11 and A14 of ../shared/docs/pi05-ki-fast.md): openpi's own pi0.5 model code
(src/openpi/models/pi0.py, gemma.py, siglip.py, model.py at the pinned commit), composed with jax.lax.stop_gradient
as the recipe of pi05-ki-fast.md §2 says. JAX on the CPU, float32, matmul precision "highest". Writes
tests/data/golden/ki/ki.json and ki.safetensors.

The model is the tiny pi0.5 of ../shared/fixtures/openpi/pi05 (its config.json: Gemma "dummy" prefix expert, width 64;
a custom action expert, width 40; a custom SigLIP, width 48; vocabulary 1024; 224x224 images, 3 cameras) built by
openpi's Pi0Config(pi05=True) with gemma.get_config, gemma.PALIGEMMA_VOCAB_SIZE and siglip.Module set to those
dimensions, and loaded with that fixture's weights.safetensors (openpi PyTorch names; the JAX layout is recovered by
pushing index-valued parameters through the JAX -> PyTorch renaming, so one table serves both directions). Inputs are
the fixture's inputs.safetensors plus a FAST block of F = 8 seeded ids per example (example 1: 5 valid, then padding).

One KI forward (the composition; openpi released no KI code):
  pass 1: PaliGemma.llm over [embed_prefix(obs); embed(FAST)] with make_attn_mask(pad, ar) (ar = 1 on every FAST row:
          one causal block after the bidirectional prefix), positions cumsum(pad) - 1; it returns the final-normed
          outputs and every layer's keys/values;
  pass 2: the action expert over embed_suffix(x_t, t) against stop_gradient(keys/values of the P rows) with the mask
          and positions of Pi0.sample_actions (the expert never attends to the FAST rows);
  CE:     FAST token j predicted from the row before it (the first from P's last valid row) through PaliGemma's tied
          embedding (gemma.Embedder.decode), log_softmax, per example the mean over its valid targets, batch mean
          (pi0_fast.py's reduction);
  FM:     mean((v_t - u_t)^2) over B, H and action dims; loss = ce_weight * CE + flow_weight * FM (1 and 10).
Self-checks (the run stops if one fails): pass 2's velocity equals the fixture's joint-pass v_t (1e-5 relative); the
forward is the same with and without the stop-gradient; the FM-only gradient of every backbone tensor is exactly 0
with the stop-gradient and the CE-only gradient of every expert-side tensor is exactly 0.

Outputs (A10) ce [B], targets [B], fm [], v_t [B,H,A]; (A11) the gradients of FM alone and of CE alone with the
stop-gradient, and of the total without it; (A14) 12 updates of openpi's train step on the KI total: value_and_grad,
openpi's optimizer.py (clip_by_global_norm 1.0, AdamW b1 0.9, b2 0.95, eps 1e-8, weight decay 1e-10, CosineDecaySchedule
warmup 4, peak 1e-3, decay 12, end 1e-4), EMA 0.9 after each update, each step on the pi05 training fixture's batch
(train.safetensors batch/step<k>: state, actions, noise, time) plus its own FAST block; per step loss, CE, FM, gradient
norm and learning rate, then every tensor's update and EMA.

Size: a tensor is kept whole only up to 256 values. Larger ones are kept as 256 values at flat (row-major) indices
(i * numel) // 256, i = 0..255, plus the Frobenius norm of the whole tensor: "<key>/sample" and "<key>/norm". All
gradients and updates of the model would be 8 MB; this keeps the goldens under 1 MB while every tensor is checked in
norm and at values spread over all of its rows.

With --bf16-deviation it writes nothing: it runs the 12 steps with openpi's own bf16 (Pi0Config dtype "bfloat16":
float32 parameters, bf16 compute, as openpi's pi0.5 configs train) and prints their errors against the float32
goldens with test_ki.cpp's A14 metrics, the figure next to which our bf16-mixed errors are read.

build and make_prefix_forward (the set-up and the [P; T; F] training forward) are shared with subtask_reference.py.

Run (from the repository root; about 5 minutes on 2 cores; the venv of tests/data/pi0_fast_model_reference.py):
    build/pi0fast_ref_venv/bin/python tests/data/ki_reference.py \\
        --openpi <openpi .git or bare repository> --fixture ../shared/fixtures/openpi/pi05 [--bf16-deviation]
"""
import argparse
import json
import os
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pi0_fast_model_reference as fastref  # noqa: E402  (openpi extraction, stubs, safetensors writer, PaliGemma names)

OUT = os.path.join(HERE, "golden", "ki")
F = 8
VALID = (8, 5)  # valid FAST tokens per example
CE_WEIGHT, FLOW_WEIGHT = 1.0, 10.0
TRAIN_STEPS = 12
SAMPLE = 256
LR, ADAMW, EMA_DECAY = fastref.LR, fastref.ADAMW, fastref.EMA_DECAY


def read_safetensors(path):
    """{name: numpy array} (the stubs replace the safetensors package; the format is a JSON header and raw bytes)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    types = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_, "F64": np.float64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], types[e["dtype"]]).reshape(e["shape"]).copy()
    return out


def to_pytorch(flat, cfg):
    """openpi's JAX pi0.5 parameters ("PaliGemma/img/...", "PaliGemma/llm/...", "action_in_proj/kernel", ...) -> its
    PyTorch names (the facts of examples/convert_jax_model_to_pytorch.py), the tied embedding under both names."""
    flat = dict(flat)
    ex = cfg["action_expert"]
    nh, hd, w = ex["num_heads"], ex["head_dim"], ex["width"]
    out = {}
    llm = "PaliGemma/llm/"
    q = flat.pop(llm + "layers/attn/q_einsum_1/w")  # [depth, N, W, H]
    kv = flat.pop(llm + "layers/attn/kv_einsum_1/w")  # [depth, 2, K, W, H]
    o = flat.pop(llm + "layers/attn/attn_vec_einsum_1/w")  # [depth, N, H, W]
    gating = flat.pop(llm + "layers/mlp_1/gating_einsum")  # [depth, 2, W, M]
    linear = flat.pop(llm + "layers/mlp_1/linear")  # [depth, M, W]
    n1k, n1b = flat.pop(llm + "layers/pre_attention_norm_1/Dense_0/kernel"), flat.pop(
        llm + "layers/pre_attention_norm_1/Dense_0/bias")
    n2k, n2b = flat.pop(llm + "layers/pre_ffw_norm_1/Dense_0/kernel"), flat.pop(
        llm + "layers/pre_ffw_norm_1/Dense_0/bias")
    e = "paligemma_with_expert.gemma_expert.model."
    for i in range(ex["depth"]):
        L = f"{e}layers.{i}."
        out[L + "self_attn.q_proj.weight"] = q[i].transpose(0, 2, 1).reshape(nh * hd, w)
        out[L + "self_attn.k_proj.weight"] = kv[i, 0, 0].T
        out[L + "self_attn.v_proj.weight"] = kv[i, 1, 0].T
        out[L + "self_attn.o_proj.weight"] = o[i].transpose(2, 0, 1).reshape(w, nh * hd)
        out[L + "mlp.gate_proj.weight"] = gating[i, 0].T
        out[L + "mlp.up_proj.weight"] = gating[i, 1].T
        out[L + "mlp.down_proj.weight"] = linear[i].T
        out[L + "input_layernorm.dense.weight"] = n1k[i].T
        out[L + "input_layernorm.dense.bias"] = n1b[i]
        out[L + "post_attention_layernorm.dense.weight"] = n2k[i].T
        out[L + "post_attention_layernorm.dense.bias"] = n2b[i]
    out[e + "norm.dense.weight"] = flat.pop(llm + "final_norm_1/Dense_0/kernel").T
    out[e + "norm.dense.bias"] = flat.pop(llm + "final_norm_1/Dense_0/bias")
    for name in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"):
        out[name + ".weight"] = flat.pop(name + "/kernel").T
        out[name + ".bias"] = flat.pop(name + "/bias")
    pg = {k.removeprefix("PaliGemma/"): v for k, v in flat.items()}
    assert len(pg) == len(flat), sorted(flat)
    for name, value in fastref.to_pytorch(pg, cfg["siglip"]["depth"], cfg["paligemma"]["depth"],
                                          cfg["paligemma"]).items():
        out["paligemma_with_expert." + name] = value
    out["paligemma_with_expert.paligemma.lm_head.weight"] = out[
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"]
    return {k: np.asarray(v) for k, v in out.items()}


def flat_state(state):
    return {"/".join(str(p) for p in path): np.asarray(var.value) for path, var in state.flat_state().items()}


def from_pytorch(shapes, weights, cfg):
    """The JAX parameters (name -> array) holding `weights` (PyTorch names): to_pytorch is a relayout, so pushing each
    parameter's flat indices through it says where every PyTorch value goes."""
    labels, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        labels[name] = np.arange(offset, offset + n, dtype=np.float64).reshape(shape)
        offset += n
    total = np.full(offset, np.nan)
    for name, idx in to_pytorch(labels, cfg).items():
        total[idx.astype(np.int64).ravel()] = weights[name].astype(np.float64).ravel()
    assert not np.isnan(total).any(), "some JAX parameter has no PyTorch tensor"
    out, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        out[name] = total[offset:offset + n].reshape(shape).astype(np.float32)
        offset += n
    return out


def keep(tensors, key, value):
    """A tensor whole, or its SAMPLE values at (i * numel) // SAMPLE and its Frobenius norm (see the docstring)."""
    v = np.asarray(value, np.float32)
    if v.size <= SAMPLE:
        tensors[key] = v
        return
    flat = v.ravel()
    idx = (np.arange(SAMPLE, dtype=np.int64) * flat.size) // SAMPLE
    tensors[key + "/sample"] = flat[idx]
    tensors[key + "/norm"] = np.array([np.linalg.norm(v.astype(np.float64))], np.float32)


def build(openpi, fixture, dtype="float32"):
    """openpi's pi0.5 at the fixture's dimensions holding its weights, in JAX on the CPU (Pi0Config's dtype: float32,
    or bfloat16 = float32 parameters and bf16 compute; matmul precision "highest"), and the fixture's files: the
    set-up every generator on the pi05 fixture shares (this one and subtask_reference.py). Returns a namespace: the
    JAX and openpi modules, cfg, weights, inputs, outputs, train_fixture, graphdef/params/rest (nnx.split(model,
    nnx.Param, ...)), b, h, cams and observation(state)."""
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_platforms", "cpu")
    src = fastref.extract_openpi(openpi, tempfile.mkdtemp(prefix="openpi_src_"))
    sys.path.insert(0, src)
    fastref.install_stubs()
    import flax.nnx as nnx
    import jax.numpy as jnp
    import optax

    import openpi.models.gemma as gemma
    import openpi.models.model as model_mod
    import openpi.models.pi0 as pi0
    import openpi.models.pi0_config as pi0_config
    import openpi.models.siglip as siglip
    import openpi.training.optimizer as optimizer

    cfg = json.load(open(os.path.join(fixture, "config.json")))
    weights = read_safetensors(os.path.join(fixture, "weights.safetensors"))
    inputs = read_safetensors(os.path.join(fixture, "inputs.safetensors"))
    outputs = read_safetensors(os.path.join(fixture, "outputs.safetensors"))
    train_fixture = read_safetensors(os.path.join(fixture, "train.safetensors"))
    pg, ex, sg_cfg = cfg["paligemma"], cfg["action_expert"], cfg["siglip"]
    dims = ("width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim")

    # The fixture's dimensions: the "dummy" Gemma is the prefix expert; the action expert and SigLIP are custom.
    assert gemma.get_config("dummy") == gemma.Config(**{k: pg[k] for k in dims})
    real_get_config = gemma.get_config
    gemma.get_config = lambda v: gemma.Config(**{k: ex[k] for k in dims}) if v == "fixture_expert" else real_get_config(v)
    gemma.PALIGEMMA_VOCAB_SIZE = cfg["vocab_size"]
    base_siglip = siglip.Module
    siglip.Module = lambda num_classes=None, *, variant=None, **kw: base_siglip(
        num_classes, variant="So400m/14", **{**kw, **{k: sg_cfg[k] for k in ("width", "depth", "mlp_dim", "num_heads")}})
    config = pi0_config.Pi0Config(dtype=dtype, pi05=True, action_dim=cfg["action_dim"],
                                  action_horizon=cfg["action_horizon"], max_token_len=cfg["max_token_len"],
                                  paligemma_variant="dummy", action_expert_variant="fixture_expert")
    model = config.create(jax.random.key(0))
    graphdef, state = nnx.split(model)
    shapes = {k: v.shape for k, v in flat_state(state).items()}
    values = from_pytorch(shapes, weights, cfg)
    for path, var in state.flat_state().items():
        var.value = jnp.asarray(values["/".join(str(p) for p in path)])
    model = nnx.merge(graphdef, state)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    # The relayout round trip is exact.
    for name, value in to_pytorch(flat_state(params), cfg).items():
        assert np.array_equal(value, weights[name]), name

    cams = cfg["image_keys"]

    def observation(state_value):
        return model_mod.Observation(
            images={c: inputs[f"image/{c}"] for c in cams}, image_masks={c: inputs[f"image_mask/{c}"] for c in cams},
            state=state_value, tokenized_prompt=inputs["tokenized_prompt"].astype(np.int32),
            tokenized_prompt_mask=inputs["tokenized_prompt_mask"].astype(bool))

    return types.SimpleNamespace(
        jax=jax, jnp=jnp, nnx=nnx, optax=optax, pi0=pi0, model_mod=model_mod, optimizer=optimizer, cfg=cfg,
        weights=weights, inputs=inputs, outputs=outputs, train_fixture=train_fixture, graphdef=graphdef, params=params,
        rest=rest, b=inputs["actions"].shape[0], h=cfg["action_horizon"], cams=cams, observation=observation)


def make_prefix_forward(e):
    """The training forward over [P; T; F] (Pi0Impl::compute_prefix_loss), from openpi's pieces:
      pass 1: PaliGemma.llm over [embed_prefix(obs); embed(T); embed(F)] with make_attn_mask(pad, ar) (ar = 1 on every
              T and F row: causal blocks after the bidirectional prefix), positions cumsum(pad) - 1; it returns the
              final-normed outputs and every layer's keys/values;
      pass 2: the action expert over embed_suffix(x_t, t) against the keys/values of the P and T rows (stop_gradient
              under KI) with the mask and positions of Pi0.sample_actions after them (n_valid(P u T) + arange): the
              expert never attends to the FAST rows;
      CE:     each target predicted from the nearest valid row before it (T's first target from the cue's last
              token; F_0 from T's EOS, or from P's last valid row without T) through the tied embedding
              (gemma.Embedder.decode), log_softmax, per example the mean over its targets, batch mean (pi0_fast.py's
              reduction), per block;
      FM:     mean((v_t - u_t)^2) over B, H and action dims.
    forward(p, obs, actions, noise, time, fast, fast_mask, stop_gradient, subtask=None) with subtask None or
    (tokens, mask, targets) [B,T] returns ce, fm, v_t, ce_mean and (with T) ce_t, ce_t_mean."""
    jax, jnp, pi0, nnx, model_mod = e.jax, e.jnp, e.pi0, e.nnx, e.model_mod

    def block_ce(m, hidden, prev_valid, tokens, targets, offset):
        rows = jnp.maximum(prev_valid[:, offset:offset + tokens.shape[1]], 0)  # padding rows: any row, weighted 0
        h_t = jnp.take_along_axis(hidden, rows[:, :, None], axis=1)
        logits = m.PaliGemma.llm(h_t, method=lambda mod, x: mod.embedder.decode(x))
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, :, None], axis=-1)[..., 0]
        return jnp.sum(nll * targets, -1) / jnp.clip(jnp.sum(targets, -1), 1)

    def forward(p, obs, actions, noise, time, fast, fast_mask, stop_gradient, subtask=None):
        m = nnx.merge(e.graphdef, p, e.rest)
        b = actions.shape[0]
        obs = model_mod.preprocess_observation(None, obs, train=False)
        t = time[:, None, None]
        x_t = t * noise + (1 - t) * actions
        u_t = noise - actions
        # Pass 1: the backbone over [P; T; F].
        prefix_tokens, prefix_mask, prefix_ar = m.embed_prefix(obs)
        tp = prefix_tokens.shape[1]
        tt = 0 if subtask is None else subtask[0].shape[1]
        blocks = ([] if subtask is None else [subtask[:2]]) + [(fast, fast_mask)]
        tokens = jnp.concatenate([prefix_tokens] + [m.PaliGemma.llm(ids, method="embed") for ids, _ in blocks], axis=1)
        pad = jnp.concatenate([prefix_mask] + [mask for _, mask in blocks], axis=1)
        ar = jnp.concatenate([prefix_ar, jnp.ones(tt + fast.shape[1], bool)])
        (hidden, _), (k, v) = m.PaliGemma.llm([tokens, None], mask=pi0.make_attn_mask(pad, ar),
                                              positions=jnp.cumsum(pad, axis=1) - 1)
        # Pass 2: the expert against P u T's keys/values (stop-gradient under KI), as Pi0.sample_actions' step.
        seen = tp + tt
        kp, vp, seen_mask = k[:, :, :seen], v[:, :, :seen], pad[:, :seen]
        if stop_gradient:
            kp, vp = jax.lax.stop_gradient(kp), jax.lax.stop_gradient(vp)
        suffix_tokens, suffix_mask, suffix_ar, cond = m.embed_suffix(obs, x_t, time)
        full_mask = jnp.concatenate([
            jnp.broadcast_to(seen_mask[:, None, :], (b, suffix_tokens.shape[1], seen)),
            pi0.make_attn_mask(suffix_mask, suffix_ar)], axis=-1)
        positions = jnp.sum(seen_mask, axis=-1)[:, None] + jnp.cumsum(suffix_mask, axis=-1) - 1
        (_, suffix_out), _ = m.PaliGemma.llm([None, suffix_tokens], mask=full_mask, positions=positions,
                                             kv_cache=(kp, vp), adarms_cond=[None, cond])
        v_t = m.action_out_proj(suffix_out[:, -e.h:])
        fm = jnp.mean(jnp.square(v_t - u_t))
        # The row each target is read from: the nearest valid row before it.
        total = pad.shape[1]
        valid_at = jnp.where(pad, jnp.arange(total)[None, :], -1)
        prev_valid = jnp.concatenate([jnp.full((b, 1), -1), jax.lax.cummax(valid_at, axis=1)[:, :-1]], axis=1)
        ce = block_ce(m, hidden, prev_valid, fast, fast_mask, seen)
        out = {"ce": ce, "fm": fm, "v_t": v_t, "ce_mean": jnp.mean(ce)}
        if subtask is not None:
            out["ce_t"] = block_ce(m, hidden, prev_valid, subtask[0], subtask[2], tp)
            out["ce_t_mean"] = jnp.mean(out["ce_t"])
        return out

    return forward


def make_ki_forward(e):
    """The KI forward over [P; F] (make_prefix_forward without a subtask block) with its total
    CE_WEIGHT * CE + FLOW_WEIGHT * FM."""
    prefix_forward = make_prefix_forward(e)

    def ki_forward(p, obs, actions, noise, time, fast, fast_mask, stop_gradient):
        out = prefix_forward(p, obs, actions, noise, time, fast, fast_mask, stop_gradient)
        return {**out, "total": CE_WEIGHT * out["ce_mean"] + FLOW_WEIGHT * out["fm"]}

    return ki_forward


def train(e, ki_forward, fast_blocks):
    """TRAIN_STEPS updates of openpi's train step on the KI total, each on the pi05 training fixture's batch of that
    step plus fast_blocks[k]: per step loss, CE, FM, gradient norm and learning rate; the final parameters and EMA."""
    jax, jnp, optax, optimizer = e.jax, e.jnp, e.optax, e.optimizer
    schedule = optimizer.CosineDecaySchedule(**LR).create()
    tx = optimizer.AdamW(**ADAMW).create(schedule)
    opt_state = tx.init(e.params)
    ema, p = e.params, e.params
    step_fn = jax.jit(jax.value_and_grad(lambda p, *a: ki_forward(p, *a, True)["total"]))
    parts_fn = jax.jit(lambda p, *a: ki_forward(p, *a, True))
    record = {"loss": [], "ce": [], "fm": [], "grad_norm": [], "lr": []}
    for k, (fast_k, mask_k) in enumerate(fast_blocks):
        batch = {n: e.train_fixture[f"batch/step{k}/{n}"] for n in ("state", "actions", "noise", "time")}
        a = jax.tree.map(jnp.asarray, (e.observation(batch["state"]), batch["actions"], batch["noise"],
                                       batch["time"], fast_k, mask_k))
        loss, grads = step_fn(p, *a)
        parts = parts_fn(p, *a)
        record["loss"].append(float(loss))
        record["ce"].append(float(parts["ce_mean"]))
        record["fm"].append(float(parts["fm"]))
        record["grad_norm"].append(float(optax.global_norm(grads)))
        record["lr"].append(float(schedule(k)))
        updates, opt_state = tx.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)
        ema = jax.tree.map(lambda old, new: EMA_DECAY * old + (1 - EMA_DECAY) * new, ema, p)
    return record, p, ema


def bf16_deviation(args):
    """openpi's own bf16 (Pi0Config dtype "bfloat16": float32 parameters, bf16 compute, as openpi's pi0.5 configs
    train) over the 12 KI steps, against the float32 goldens in OUT: printed with the metrics of test_ki.cpp's A14
    (per-step relative errors; each tensor's update and EMA, Frobenius over the kept values and the norm), so that
    our bf16-mixed error there can be read next to openpi's. Writes nothing."""
    e = build(args.openpi, args.fixture, dtype="bfloat16")
    golden = read_safetensors(os.path.join(OUT, "ki.safetensors"))
    fast_blocks = [(golden[f"train/step{k}/fast_tokens"].astype(np.int32), golden[f"train/step{k}/fast_mask"])
                   for k in range(TRAIN_STEPS)]
    record, p, ema = train(e, make_ki_forward(e), fast_blocks)
    for key in ("loss", "grad_norm", "ce", "fm"):
        ref = golden[f"train/{key}"].astype(np.float64)
        err = np.max(np.abs(np.array(record[key]) - ref) / np.abs(ref))
        print(f"openpi bf16 vs float32 A14 {key}: max rel {err:.2e}")
    start = to_pytorch(flat_state(e.params), e.cfg)
    for prefix, st in (("update", p), ("ema_update", ema)):
        worst, worst_name = 0.0, ""
        for name, value in to_pytorch(flat_state(st), e.cfg).items():
            if name == "paligemma_with_expert.paligemma.lm_head.weight" or "self_attn.k_proj.bias" in name:
                continue  # the tied table under embed_tokens; key biases: rounding noise (test_ki.cpp skips them)
            mine = {}
            keep(mine, "x", value.astype(np.float64) - start[name])
            if "x" in mine:
                err = np.linalg.norm(mine["x"] - golden[f"train/{prefix}/{name}"]) / np.linalg.norm(
                    golden[f"train/{prefix}/{name}"])
            else:
                ref, ref_norm = golden[f"train/{prefix}/{name}/sample"], golden[f"train/{prefix}/{name}/norm"][0]
                err = max(np.linalg.norm(mine["x/sample"] - ref) / np.linalg.norm(ref),
                          abs(mine["x/norm"][0] - ref_norm) / ref_norm)
            if err > worst:
                worst, worst_name = err, name
        print(f"openpi bf16 vs float32 A14 {prefix}: max rel (Frobenius) {worst:.2e} ({worst_name})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openpi", required=True, help="openpi's .git or bare repository")
    parser.add_argument("--fixture", required=True, help="../shared/fixtures/openpi/pi05")
    parser.add_argument("--bf16-deviation", action="store_true",
                        help="print openpi's own bf16 12-step errors against the float32 goldens; write nothing")
    args = parser.parse_args()
    if args.bf16_deviation:
        bf16_deviation(args)
        return
    e = build(args.openpi, args.fixture)
    jax, jnp, optax = e.jax, e.jnp, e.optax
    cfg, inputs, outputs, params, b = e.cfg, e.inputs, e.outputs, e.params, e.b
    observation = e.observation
    rng = np.random.default_rng(45)

    def fast_block():
        tokens = rng.integers(1, cfg["vocab_size"], size=(b, F)).astype(np.int32)
        mask = np.zeros((b, F), bool)
        for i, n in enumerate(VALID):
            mask[i, :n] = True
        return np.where(mask, tokens, 0).astype(np.int32), mask

    ki_forward = make_ki_forward(e)

    obs = observation(inputs["state"])
    actions, noise, time = inputs["actions"], inputs["noise"], inputs["time"]
    fast, fast_mask = fast_block()
    args_ = jax.tree.map(jnp.asarray, (obs, actions, noise, time, fast, fast_mask))  # jax arrays: openpi type-checks
    fwd = jax.jit(ki_forward, static_argnums=7)
    on, off = fwd(params, *args_, True), fwd(params, *args_, False)
    err = float(np.abs(np.asarray(on["v_t"]) - outputs["v_t"]).max() / np.abs(outputs["v_t"]).max())
    print(f"self-check: KI pass-2 v_t vs the fixture's joint-pass v_t: max rel {err:.2e}", file=sys.stderr)
    assert err < 1e-5
    for key in ("ce", "fm", "v_t"):
        assert np.array_equal(np.asarray(on[key]), np.asarray(off[key])), key

    def grads_of(part, stop_gradient):
        g = jax.jit(jax.grad(lambda p: ki_forward(p, *args_, stop_gradient)[part]))(params)
        return to_pytorch(flat_state(g), cfg)

    def backbone(name):
        return name.startswith("paligemma_with_expert.paligemma.")

    tensors = {"fast_tokens": fast.astype(np.int64), "fast_mask": fast_mask, "ce": np.asarray(on["ce"]),
               "targets": fast_mask.sum(1).astype(np.float32), "fm": np.asarray(on["fm"]).reshape(1),
               "v_t": np.asarray(on["v_t"])}
    grad_sets = {"fm_ki": grads_of("fm", True), "ce_ki": grads_of("ce_mean", True), "total_no_ki": grads_of("total", False)}
    zero = {}
    for set_name, g in grad_sets.items():
        g.pop("paligemma_with_expert.paligemma.lm_head.weight")  # the tied table, under embed_tokens
        zero[set_name] = sorted(n for n, v in g.items() if not np.any(v))
        for name, value in g.items():
            if set_name == "fm_ki" and backbone(name) or set_name == "ce_ki" and not backbone(name):
                assert not np.any(value), f"{set_name}: {name} is reached through the stop-gradient"
            elif np.any(value):
                keep(tensors, f"grad/{set_name}/{name}", value)
    print("self-check: FM-only backbone and CE-only expert gradients exactly 0; all-zero:", zero, file=sys.stderr)

    # A14: openpi's train step on the KI total.
    fast_blocks = [fast_block() for _ in range(TRAIN_STEPS)]
    for k, (fast_k, mask_k) in enumerate(fast_blocks):
        tensors[f"train/step{k}/fast_tokens"] = fast_k.astype(np.int64)
        tensors[f"train/step{k}/fast_mask"] = mask_k
    record, p, ema = train(e, ki_forward, fast_blocks)
    for key, value in record.items():
        tensors[f"train/{key}"] = np.array(value, np.float32)
    start = to_pytorch(flat_state(params), cfg)
    for prefix, st in (("update", p), ("ema_update", ema)):
        for name, value in to_pytorch(flat_state(st), cfg).items():
            if name != "paligemma_with_expert.paligemma.lm_head.weight":
                keep(tensors, f"train/{prefix}/{name}", value.astype(np.float64) - start[name])
    print("train", record, file=sys.stderr)

    os.makedirs(OUT, exist_ok=True)
    fastref.write_safetensors(os.path.join(OUT, "ki.safetensors"), tensors)
    meta = {
        "what": "openpi pi0.5 (pi0.py, gemma.py) composed with stop_gradient for knowledge insulation at the tiny "
                "dimensions of ../shared/fixtures/openpi/pi05; see tests/data/ki_reference.py",
        "openpi_commit": fastref.tokref.OPENPI_COMMIT,
        "versions": {"jax": jax.__version__, "flax": __import__("flax").__version__, "optax": optax.__version__,
                     "numpy": np.__version__},
        "fixture": "pi05", "fast_tokens": F, "valid": list(VALID), "ce_weight": CE_WEIGHT, "flow_weight": FLOW_WEIGHT,
        "sample": SAMPLE, "self_check_v_t_rel": err, "all_zero_grads": zero,
        "forward": {"ce": np.asarray(on["ce"]).tolist(), "fm": float(on["fm"])},
        "train": {"steps": TRAIN_STEPS, "lr_schedule": LR, "optimizer": ADAMW, "ema_decay": EMA_DECAY, **record},
    }
    with open(os.path.join(OUT, "ki.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
