#!/usr/bin/env python3
"""Reference generator for subtask prediction (docs/subtask.md; Pi0Impl::compute_prefix_loss with a subtask block,
decode_subtask and sample_actions_after_subtask; tests/unit/model/test_ki.cpp, tag [parity][subtask]; acceptance tests
A15 and A10's CE_T of ../shared/docs/pi05-ki-fast.md): openpi's own pi0.5 code (pi0.py, gemma.py, siglip.py at the
pinned commit) composed as our code composes it, on the tiny pi0.5 of ../shared/fixtures/openpi/pi05 with its weights
and inputs. The set-up (openpi's source, the stubs, the model at the fixture's dimensions, its weights, the JAX <->
PyTorch names) and the training forward over [P; T; F] are ki_reference.py's (build, make_prefix_forward). JAX on the
CPU, float32, matmul precision "highest". Writes tests/data/golden/ki/subtask.json and subtask.safetensors.

Training forward (A10's CE_T, KI on): the fixture's observation, actions, noise and time; a subtask block T of
T_LEN = 10 rows per example, cue (CUE, 3 seeded ids) + text (5 and 1 seeded ids) + EOS (1), right-padded (example 0:
9 valid rows, example 1: 5); targets are the valid rows after the cue. A FAST block of 8 seeded ids (6 and 3 valid).
The backbone reads [P; T; F]; the expert reads stop_gradient(P u T's keys/values). Outputs ce_t [B] with
targets_t [B], ce (FAST) [B], fm, v_t [B,H,A], the loss CE_WEIGHT * mean(ce) + SUBTASK_WEIGHT * mean(ce_t) +
FLOW_WEIGHT * fm and its gradient (every tensor, kept as ki_reference.py's `keep`: whole up to 256 values, else 256
values and the norm).

Decoding (A15), as Pi0Impl::decode_subtask, on the fixture's model with one change: the backbone's final-norm scale
(gemma's final_norm/scale, our language_model.norm.weight; 64 values) replaced by seeded N(0, DECODE_NORM_STD^2)
values, kept as decode_final_norm_weight. With the fixture's own weights greedy decoding only copies its last input
token (the random model's output row is dominated by that token's embedding, which the tied table scores highest), so
every decoded id would equal the cue's last; the new scale turns the final hidden state away from it, and the tokens
then follow the model (other ids at each step, a different sequence per example). The final norm feeds only the
logits, never the keys and values the expert reads. openpi's prefix pass (Pi0.sample_actions' first call), the cue's
rows through gemma's growing KV cache (each call's returned cache is the given one with the new rows appended:
gemma.py's Attention), then one row at a time the argmax of the tied embedding's logits at the last row; an example
that has produced END_ID gets padding rows (mask false, id 0) afterwards; decoding stops when every example has ended
or the block has MAX_TOKENS rows (cue included). New rows attend to every valid cached row and causally among
themselves; their positions are n_valid(cache) + cumsum(mask) - 1. END_ID is a token greedy decoding emits (a probe
run without an end says which): example 0 emits it at its 4th generated token, example 1 never does, so one example
ends early and the other runs to MAX_TOKENS. Outputs the block (decoded_tokens, decoded_mask), each generated row's
argmax margin (top-1 minus top-2 logit; 0 on padding rows) and the largest |logit| of the decoding (in the JSON).
Sampling after it: Pi0.sample_actions' Euler loop (NUM_STEPS = 10 from t = 1, dt = -1/10, from the fixture's noise)
against the grown cache, with the mask and positions of its step after all cached rows. Output sampled_actions.
Self-checks (the run stops if one fails): the Euler loop with no subtask rows equals openpi's own
Pi0.sample_actions (1e-5 relative); actions after the block fed at once (teacher-forced) equal those after decoding it
row by row (1e-5); the forward is the same with and without the stop-gradient; the FM-only gradient of every backbone
tensor is exactly 0.

Run (from the repository root; about 2.5 minutes on 2 cores; the venv of tests/data/pi0_fast_model_reference.py):
    build/pi0fast_ref_venv/bin/python tests/data/subtask_reference.py \\
        --openpi <openpi .git or bare repository> --fixture ../shared/fixtures/openpi/pi05
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ki_reference as ki  # noqa: E402  (the shared set-up and the [P; T; F] training forward)

OUT = ki.OUT
T_LEN = 10
CUE_LEN = 3
TEXT = (5, 1)  # text tokens per example (then EOS)
EOS = 1  # PaliGemma's
F = 8
FAST_VALID = (6, 3)
CE_WEIGHT, SUBTASK_WEIGHT, FLOW_WEIGHT = 1.0, 0.5, 10.0
MAX_TOKENS = 12
END_STEP = 3  # example 0's generated token at this index (0-based) is the end id
DECODE_NORM_STD, DECODE_NORM_SEED = 3.0, 7  # the decoding case's final-norm scale (the docstring says why)
NUM_STEPS = 10


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openpi", required=True, help="openpi's .git or bare repository")
    parser.add_argument("--fixture", required=True, help="../shared/fixtures/openpi/pi05")
    args = parser.parse_args()
    e = ki.build(args.openpi, args.fixture)
    jax, jnp, nnx, pi0 = e.jax, e.jnp, e.nnx, e.pi0
    cfg, inputs, params, b = e.cfg, e.inputs, e.params, e.b
    vocab, pg_width = cfg["vocab_size"], cfg["paligemma"]["width"]
    rng = np.random.default_rng(4515)

    # The blocks: ids drawn from 2.. (0 is padding, 1 is EOS).
    cue = rng.integers(2, vocab, size=CUE_LEN).astype(np.int32)
    sub = np.zeros((b, T_LEN), np.int32)
    sub_mask = np.zeros((b, T_LEN), bool)
    for i, n in enumerate(TEXT):
        row = np.concatenate([cue, rng.integers(2, vocab, size=n).astype(np.int32), [EOS]])
        sub[i, :len(row)], sub_mask[i, :len(row)] = row, True
    sub_targets = sub_mask & (np.arange(T_LEN) >= CUE_LEN)[None, :]
    fast = rng.integers(2, vocab, size=(b, F)).astype(np.int32)
    fast_mask = np.arange(F)[None, :] < np.array(FAST_VALID)[:, None]
    fast = np.where(fast_mask, fast, 0).astype(np.int32)

    obs = e.observation(inputs["state"])
    actions, noise, time = inputs["actions"], inputs["noise"], inputs["time"]
    forward = ki.make_prefix_forward(e)

    a_sub = tuple(jnp.asarray(x) for x in (sub, sub_mask, sub_targets))
    a = jax.tree.map(jnp.asarray, (obs, actions, noise, time, fast, fast_mask))

    def parts(p, stop_gradient):
        out = forward(p, *a, stop_gradient, subtask=a_sub)
        out["total"] = CE_WEIGHT * out["ce_mean"] + SUBTASK_WEIGHT * out["ce_t_mean"] + FLOW_WEIGHT * out["fm"]
        return out

    on = jax.jit(parts, static_argnums=1)(params, True)
    off = jax.jit(parts, static_argnums=1)(params, False)
    for key in ("ce", "ce_t", "fm", "v_t", "total"):
        assert np.array_equal(np.asarray(on[key]), np.asarray(off[key])), key
    grads = ki.to_pytorch(ki.flat_state(jax.jit(jax.grad(lambda p: parts(p, True)["total"]))(params)), cfg)
    grads.pop("paligemma_with_expert.paligemma.lm_head.weight")  # the tied table, under embed_tokens
    fm_grads = ki.to_pytorch(ki.flat_state(jax.jit(jax.grad(lambda p: parts(p, True)["fm"]))(params)), cfg)
    for name, value in fm_grads.items():
        if name.startswith("paligemma_with_expert.paligemma."):
            assert not np.any(value), f"fm: {name} is reached through the stop-gradient"
    print("self-check: forward equal with and without the stop-gradient; FM-only backbone gradients exactly 0",
          file=sys.stderr)
    print("ce_t", np.asarray(on["ce_t"]), "ce", np.asarray(on["ce"]), "fm", float(on["fm"]), "total",
          float(on["total"]), file=sys.stderr)

    # Decoding through the growing cache, then the Euler loop against it.
    def prefill(p, obs):
        m = nnx.merge(e.graphdef, p, e.rest)
        obs = e.model_mod.preprocess_observation(None, obs, train=False)
        tokens, mask, ar = m.embed_prefix(obs)
        _, cache = m.PaliGemma.llm([tokens, None], mask=pi0.make_attn_mask(mask, ar),
                                   positions=jnp.cumsum(mask, axis=1) - 1)
        return cache, mask

    def extend(p, cache, pad, ids, mask):
        """ids [B,n] as causal rows after the cached ones: their final-normed outputs and the grown cache."""
        m = nnx.merge(e.graphdef, p, e.rest)
        n = ids.shape[1]
        attn = jnp.concatenate([jnp.broadcast_to(pad[:, None, :], (b, n, pad.shape[1])),
                                pi0.make_attn_mask(mask, jnp.ones(n, bool))], axis=-1)
        positions = jnp.sum(pad, axis=-1)[:, None] + jnp.cumsum(mask, axis=-1) - 1
        (out, _), cache = m.PaliGemma.llm([m.PaliGemma.llm(ids, method="embed"), None], mask=attn,
                                          positions=positions, kv_cache=cache)
        logits = m.PaliGemma.llm(out[:, -1], method=lambda mod, x: mod.embedder.decode(x))
        return logits, cache, jnp.concatenate([pad, mask], axis=1)

    def euler_step(p, cache, pad, obs, x_t, t):
        """Pi0.sample_actions' step, against the cache and its mask."""
        m = nnx.merge(e.graphdef, p, e.rest)
        obs = e.model_mod.preprocess_observation(None, obs, train=False)
        suffix_tokens, suffix_mask, suffix_ar, cond = m.embed_suffix(obs, x_t, jnp.broadcast_to(t, b))
        s = suffix_tokens.shape[1]
        full_mask = jnp.concatenate([jnp.broadcast_to(pad[:, None, :], (b, s, pad.shape[1])),
                                     pi0.make_attn_mask(suffix_mask, suffix_ar)], axis=-1)
        positions = jnp.sum(pad, axis=-1)[:, None] + jnp.cumsum(suffix_mask, axis=-1) - 1
        (_, suffix_out), _ = m.PaliGemma.llm([None, suffix_tokens], mask=full_mask, positions=positions,
                                             kv_cache=cache, adarms_cond=[None, cond])
        return m.action_out_proj(suffix_out[:, -e.h:])

    prefill_j, extend_j, step_j = jax.jit(prefill), jax.jit(extend), jax.jit(euler_step)
    obs_j = jax.tree.map(jnp.asarray, obs)
    # The decoding case's model: the fixture's with the backbone's final-norm scale replaced (see the docstring).
    norm_scale = np.random.default_rng(DECODE_NORM_SEED).normal(0, DECODE_NORM_STD, pg_width).astype(np.float32)
    params = jax.tree.map(lambda x: x, params)  # a copy: the training forward above read the fixture's
    replaced = 0
    for path, var in params.flat_state().items():
        if "/".join(str(q) for q in path) == "PaliGemma/llm/final_norm/scale":
            var.value, replaced = jnp.asarray(norm_scale), replaced + 1
    assert replaced == 1

    def sample(cache, pad):
        dt = -1.0 / NUM_STEPS
        x_t, t = jnp.asarray(noise), jnp.float32(1.0)
        while t >= -dt / 2:  # Pi0.sample_actions' cond
            x_t, t = x_t + dt * step_j(params, cache, pad, obs_j, x_t, t), t + dt
        return np.asarray(x_t)

    def decode(end_id):
        cache, pad = prefill_j(params, obs_j)
        cue_ids = jnp.broadcast_to(jnp.asarray(cue)[None, :], (b, CUE_LEN))
        logits, cache, pad = extend_j(params, cache, pad, cue_ids, jnp.ones((b, CUE_LEN), bool))
        tokens, masks, margins = [np.asarray(cue_ids)], [np.ones((b, CUE_LEN), bool)], []
        done, max_abs = np.zeros(b, bool), 0.0
        for _ in range(CUE_LEN, MAX_TOKENS):
            lg = np.asarray(logits)
            valid = ~done
            max_abs = max(max_abs, float(np.abs(lg[valid]).max()))
            nxt = np.where(valid, lg.argmax(-1), 0).astype(np.int32)
            top2 = np.sort(lg, axis=-1)[:, -2:]
            margins.append(np.where(valid, top2[:, 1] - top2[:, 0], 0).astype(np.float32))
            logits, cache, pad = extend_j(params, cache, pad, jnp.asarray(nxt[:, None]), jnp.asarray(valid[:, None]))
            tokens.append(nxt[:, None])
            masks.append(valid[:, None])
            done |= valid & (nxt == end_id)
            if done.all():
                break
        return np.concatenate(tokens, 1), np.concatenate(masks, 1), np.stack(margins, 1), cache, pad, max_abs

    # The end id: example 0's END_STEP-th generated token, which must be new there and never come from example 1.
    probe = decode(end_id=-1)[0]
    print("probe (no end):", probe.tolist(), file=sys.stderr)
    end_id = int(probe[0, CUE_LEN + END_STEP])
    assert end_id not in probe[0, CUE_LEN:CUE_LEN + END_STEP] and end_id not in probe[1, CUE_LEN:], (end_id, probe)
    tokens, mask, margins, cache, pad, max_abs_logit = decode(end_id)
    print("decoded:", tokens.tolist(), mask.tolist(), "min margin", margins[margins > 0].min(), file=sys.stderr)
    actions_after = sample(cache, pad)

    # Self-checks of the composition: the Euler loop is openpi's; decoding row by row equals the block at once.
    cache0, pad0 = prefill_j(params, obs_j)
    plain = sample(cache0, pad0)
    model = nnx.merge(e.graphdef, params, e.rest)
    openpi_plain = np.asarray(model.sample_actions(jax.random.key(0), obs_j, num_steps=NUM_STEPS,
                                                   noise=jnp.asarray(noise)))
    err_plain = float(np.abs(plain - openpi_plain).max() / np.abs(openpi_plain).max())
    print(f"self-check: Euler loop vs openpi's sample_actions: max rel {err_plain:.2e}", file=sys.stderr)
    assert err_plain < 1e-5  # (measured 2.3e-6: one jit per step here, one while_loop there: other fusions)
    _, cache_tf, pad_tf = extend_j(params, cache0, pad0, jnp.asarray(tokens), jnp.asarray(mask))
    teacher = sample(cache_tf, pad_tf)
    err_tf = float(np.abs(teacher - actions_after).max() / np.abs(actions_after).max())
    print(f"self-check: actions after the teacher-forced block vs after decoding: max rel {err_tf:.2e}",
          file=sys.stderr)
    assert err_tf < 1e-5

    tensors = {"subtask_tokens": sub.astype(np.int64), "subtask_mask": sub_mask, "subtask_targets": sub_targets,
               "fast_tokens": fast.astype(np.int64), "fast_mask": fast_mask, "ce_t": np.asarray(on["ce_t"]),
               "targets_t": sub_targets.sum(1).astype(np.float32), "ce": np.asarray(on["ce"]),
               "fm": np.asarray(on["fm"]).reshape(1), "total": np.asarray(on["total"]).reshape(1),
               "v_t": np.asarray(on["v_t"]), "cue": cue.astype(np.int64), "decoded_tokens": tokens.astype(np.int64),
               "decoded_mask": mask, "decoded_margins": margins, "sampled_actions": actions_after,
               "decode_final_norm_weight": norm_scale}
    for name, value in grads.items():
        if np.any(value):
            ki.keep(tensors, f"grad/total_ki/{name}", value)
    zero = sorted(n for n, v in grads.items() if not np.any(v))

    os.makedirs(OUT, exist_ok=True)
    ki.fastref.write_safetensors(os.path.join(OUT, "subtask.safetensors"), tensors)
    meta = {
        "what": "openpi pi0.5 (pi0.py, gemma.py) composed as Pi0Impl::compute_prefix_loss (subtask block, KI on) and "
                "decode_subtask / sample_actions_after_subtask at the tiny dimensions of ../shared/fixtures/openpi/"
                "pi05; see tests/data/subtask_reference.py",
        "openpi_commit": ki.fastref.tokref.OPENPI_COMMIT,
        "versions": {"jax": jax.__version__, "flax": __import__("flax").__version__, "numpy": np.__version__},
        "fixture": "pi05", "subtask_len": T_LEN, "cue_len": CUE_LEN, "eos": EOS, "fast_tokens": F,
        "ce_weight": CE_WEIGHT, "subtask_weight": SUBTASK_WEIGHT, "flow_weight": FLOW_WEIGHT, "sample": ki.SAMPLE,
        "max_tokens": MAX_TOKENS, "end_id": end_id, "num_steps": NUM_STEPS, "all_zero_grads": zero,
        "self_check_euler_vs_openpi_rel": err_plain, "self_check_teacher_forced_rel": err_tf,
        "min_decode_margin": float(margins[margins > 0].min()), "max_abs_decode_logit": max_abs_logit,
        "decode_final_norm": {"std": DECODE_NORM_STD, "seed": DECODE_NORM_SEED},
        "forward": {"ce_t": np.asarray(on["ce_t"]).tolist(), "ce": np.asarray(on["ce"]).tolist(),
                    "fm": float(on["fm"]), "total": float(on["total"])},
    }
    with open(os.path.join(OUT, "subtask.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
