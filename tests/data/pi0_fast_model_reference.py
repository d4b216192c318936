#!/usr/bin/env python3
"""Reference generator for model::Pi0Fast (tests/unit/model/test_pi0_fast.cpp, tag [fast]): openpi's own pi0-FAST
(src/openpi/models/pi0_fast.py, gemma_fast.py, siglip.py, model.py at the pinned commit) at tiny dimensions, run with
JAX on the CPU in float32 at matmul precision "highest". Writes tests/data/golden/pi0_fast/model.json,
model_weights.safetensors and model_cases.safetensors.

The model: Pi0FASTConfig(dtype="float32") with gemma_fast.get_config returning a tiny Gemma (width 64, depth 4, mlp 128,
8 heads, 1 kv head, head_dim 16: the shared fixtures' prefix expert) over the 793-piece SentencePiece vocabulary of
../shared/fixtures/openpi/tokenizer_spm.model, and siglip.Module with the fixtures' tiny SigLIP (width 48, depth 2,
mlp 96, 4 heads, patch 14, learned posemb, no pooling, head 48 -> 64). Images are 28x28 (model.IMAGE_RESOLUTION and
preprocess_observation's default are set to it; 4 tokens per camera) so the goldens stay small; the code paths are the
224x224 ones. Every parameter is replaced by seeded random values (norm scales and the SigLIP head included, which
openpi initializes to zero) so that every path contributes.

Inputs: batch 2, cameras base_0_rgb, base_1_rgb, wrist_0_rgb (pi0-FAST's), prompts tokenized by openpi's FASTTokenizer
(tokenizer.py, as in pi0_fast_reference.py: FAST tokenizer "a" of tests/data/golden/fast/) with max_token_len 64.
Cases: "all_cameras" and "masked_camera" (example 1's wrist_0_rgb masked, which also exercises sample_actions'
left_to_right_align / prefix_start quirk with a hole in the prefix), "eos_one_row" and "eos_all_rows" (the masked-camera
inputs with EOS's embedding row set so that greedy decoding emits EOS in row 0 only, which keeps decoding, or in both
rows at the first step, where openpi stops).
Outputs per case: compute_loss per example [B]; the logits compute_loss takes the log-softmax of ([B, L-1, V], captured
at jax.nn.log_softmax), kept only at loss-masked target positions; greedy sample_actions(max_decoding_steps=10) tokens
and, per decoding step, the logits argmax was taken of (captured at jnp.argmax, run under jax.disable_jit so that the
while_loop runs step by step).
Training: 12 updates of openpi's train step (value_and_grad of the batch-mean loss; openpi's optimizer.py AdamW:
clip_by_global_norm(1.0) + optax adamw(b1 0.9, b2 0.95, eps 1e-8, weight decay 1e-10) with its CosineDecaySchedule
(warmup 4, peak 1e-3, decay 12, end 1e-4); EMA 0.9 after each update), each on its own batch: per-step loss, gradient
norm, learning rate, and the weights and EMA after the 12 updates (PyTorch names).

Weights are written under openpi's PyTorch names of PaliGemma (as examples/convert_jax_model_to_pytorch.py maps them,
without the "paligemma_with_expert." prefix): paligemma.model.{vision_tower.vision_model, multi_modal_projector.linear,
language_model}.*; the embedding is tied (no lm_head tensor).

Run (from the repository root; about 6 minutes on 2 cores; writes about 4.3 MB; the venv of pi0_fast_reference.py plus):
    build/pi0fast_ref_venv/bin/pip install jax==0.5.3 jaxlib==0.5.3 flax==0.10.2 ml-dtypes==0.4.1 einops==0.8.1 \\
        jaxtyping==0.2.36 beartype==0.19.0 ml-collections==1.0.0 typing-extensions==4.13.2 optax==0.2.4 chex==0.1.90
    build/pi0fast_ref_venv/bin/python tests/data/pi0_fast_model_reference.py \\
        --openpi <openpi .git or bare repository> --spm ../shared/fixtures/openpi/tokenizer_spm.model
(flax 0.10.2 pulls orbax-checkpoint, tensorstore, msgpack, rich, treescope: versions as pip resolves them; none of them
computes anything here.)
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pi0_fast_reference as tokref  # noqa: E402

OUT = os.path.join(HERE, "golden", "pi0_fast")
IMAGE = 28
MAX_LEN = 64
STEPS = 10
TRAIN_STEPS = 12
LR = dict(warmup_steps=4, peak_lr=1e-3, decay_steps=12, decay_lr=1e-4)  # as the shared fixtures' training steps
ADAMW = dict(b1=0.9, b2=0.95, eps=1e-8, weight_decay=1e-10, clip_gradient_norm=1.0)  # openpi's AdamW defaults
EMA_DECAY = 0.9
CAMERAS = ("base_0_rgb", "base_1_rgb", "wrist_0_rgb")
GEMMA = dict(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16)
SIGLIP = dict(width=48, depth=2, mlp_dim=96, num_heads=4)


def extract_openpi(openpi, dest):
    """src/openpi of the pinned commit, from a bare repository or a .git directory, under dest."""
    data = subprocess.run(["git", "--git-dir", openpi, "archive", tokref.OPENPI_COMMIT, "src/openpi"], check=True,
                          capture_output=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        tarfile.open(fileobj=f).extractall(dest)
    return os.path.join(dest, "src")


def install_stubs():
    """Modules openpi imports but that nothing here runs: torch (annotations only), safetensors, augmax (training
    augmentation), the PyTorch model, transformers (the FAST processor comes from tokref)."""
    torch = types.ModuleType("torch")

    class Tensor:  # `jax.Array | torch.Tensor` annotations
        pass

    torch.Tensor = Tensor
    torch.uint8 = object()
    torch.float32 = object()
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = types.ModuleType("torch.nn.functional")
    for name, mod in (("torch", torch), ("torch.nn", torch.nn), ("torch.nn.functional", torch.nn.functional),
                      ("safetensors", types.ModuleType("safetensors")), ("augmax", types.ModuleType("augmax"))):
        sys.modules[name] = mod
    pt = types.ModuleType("openpi.models_pytorch.pi0_pytorch")
    sys.modules["openpi.models_pytorch"] = types.ModuleType("openpi.models_pytorch")
    sys.modules["openpi.models_pytorch.pi0_pytorch"] = pt
    sys.modules["openpi.models_pytorch"].pi0_pytorch = pt


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype == np.int32:
            a = a.astype(np.int64)
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL"}[a.dtype]
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path), delete=False, suffix=".tmp") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)


def to_pytorch(flat, depth_img, depth_llm, gemma):
    """openpi's JAX PaliGemma parameters -> its PyTorch names (the facts of convert_jax_model_to_pytorch.py)."""
    pre = "paligemma.model."
    vis = pre + "vision_tower.vision_model."
    out = {}
    w = flat.pop("img/embedding/kernel")
    out[vis + "embeddings.patch_embedding.weight"] = w.transpose(3, 2, 0, 1)
    out[vis + "embeddings.patch_embedding.bias"] = flat.pop("img/embedding/bias")
    pe = flat.pop("img/pos_embedding")
    out[vis + "embeddings.position_embedding.weight"] = pe.reshape(-1, pe.shape[-1])
    blk = "img/Transformer/encoderblock/"
    for i in range(depth_img):
        L = f"{vis}encoder.layers.{i}."
        out[L + "layer_norm1.weight"] = flat[blk + "LayerNorm_0/scale"][i]
        out[L + "layer_norm1.bias"] = flat[blk + "LayerNorm_0/bias"][i]
        out[L + "layer_norm2.weight"] = flat[blk + "LayerNorm_1/scale"][i]
        out[L + "layer_norm2.bias"] = flat[blk + "LayerNorm_1/bias"][i]
        out[L + "mlp.fc1.weight"] = flat[blk + "MlpBlock_0/Dense_0/kernel"][i].T
        out[L + "mlp.fc1.bias"] = flat[blk + "MlpBlock_0/Dense_0/bias"][i]
        out[L + "mlp.fc2.weight"] = flat[blk + "MlpBlock_0/Dense_1/kernel"][i].T
        out[L + "mlp.fc2.bias"] = flat[blk + "MlpBlock_0/Dense_1/bias"][i]
        att = blk + "MultiHeadDotProductAttention_0/"
        for jax_name, pt in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            k = flat[att + jax_name + "/kernel"][i]  # [W, heads, hd]
            out[L + f"self_attn.{pt}.weight"] = k.reshape(k.shape[0], -1).T
            out[L + f"self_attn.{pt}.bias"] = flat[att + jax_name + "/bias"][i].reshape(-1)
        k = flat[att + "out/kernel"][i]  # [heads, hd, W]
        out[L + "self_attn.out_proj.weight"] = k.reshape(-1, k.shape[-1]).T
        out[L + "self_attn.out_proj.bias"] = flat[att + "out/bias"][i]
    for key in [k for k in flat if k.startswith(blk)]:
        flat.pop(key)
    out[vis + "post_layernorm.weight"] = flat.pop("img/Transformer/encoder_norm/scale")
    out[vis + "post_layernorm.bias"] = flat.pop("img/Transformer/encoder_norm/bias")
    out[pre + "multi_modal_projector.linear.weight"] = flat.pop("img/head/kernel").T
    out[pre + "multi_modal_projector.linear.bias"] = flat.pop("img/head/bias")
    lm = pre + "language_model."
    out[lm + "embed_tokens.weight"] = flat.pop("llm/embedder/input_embedding")
    q = flat.pop("llm/layers/attn/q_einsum/w")  # [depth, N, W, H]
    kv = flat.pop("llm/layers/attn/kv_einsum/w")  # [depth, 2, K, W, H]
    o = flat.pop("llm/layers/attn/attn_vec_einsum/w")  # [depth, N, H, W]
    gating = flat.pop("llm/layers/mlp/gating_einsum")  # [depth, 2, W, M]
    linear = flat.pop("llm/layers/mlp/linear")  # [depth, M, W]
    n1 = flat.pop("llm/layers/pre_attention_norm/scale")
    n2 = flat.pop("llm/layers/pre_ffw_norm/scale")
    nh, hd, width = gemma["num_heads"], gemma["head_dim"], gemma["width"]
    for i in range(depth_llm):
        L = f"{lm}layers.{i}."
        out[L + "self_attn.q_proj.weight"] = q[i].transpose(0, 2, 1).reshape(nh * hd, width)
        out[L + "self_attn.k_proj.weight"] = kv[i, 0, 0].T
        out[L + "self_attn.v_proj.weight"] = kv[i, 1, 0].T
        out[L + "self_attn.o_proj.weight"] = o[i].transpose(2, 0, 1).reshape(width, nh * hd)
        out[L + "mlp.gate_proj.weight"] = gating[i, 0].T
        out[L + "mlp.up_proj.weight"] = gating[i, 1].T
        out[L + "mlp.down_proj.weight"] = linear[i].T
        out[L + "input_layernorm.weight"] = n1[i]
        out[L + "post_attention_layernorm.weight"] = n2[i]
    out[lm + "norm.weight"] = flat.pop("llm/final_norm/scale")
    assert not flat, sorted(flat)
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def flat_params(state):
    """{"img/...", "llm/...": array} of an nnx State under PaliGemma (the names to_pytorch reads)."""
    return {"/".join(str(p) for p in path).removeprefix("PaliGemma/"): np.asarray(var.value)
            for path, var in state.flat_state().items()}


def train_reference(model, nnx, jax, jnp, model_mod, fast_tok, images, rng, h, d, tensors):
    """TRAIN_STEPS updates of openpi's train step (scripts/train.py's logic: value_and_grad of the batch mean of
    compute_loss over every parameter, then its optimizer, then the EMA), each on its own batch (state, actions and so
    the FAST tokens change per step; images fixed, every camera on). compute_loss runs with train=False: no
    augmentation, as in the shared fixtures' training steps."""
    import optax

    import openpi.training.optimizer as _optimizer

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    schedule = _optimizer.CosineDecaySchedule(**LR).create()
    tx = _optimizer.AdamW(**ADAMW).create(schedule)
    opt_state = tx.init(params)
    ema = params
    losses, norms, lrs = [], [], []
    masks = {c: np.ones(2, bool) for c in CAMERAS}
    for k in range(TRAIN_STEPS):
        states = np.round(rng.uniform(-1, 1, size=(2, d)), 4)
        actions = np.stack([tokref.smooth(rng, h, d), tokref.smooth(rng, h, d, 0.7)])
        tok = [fast_tok.tokenize(f"task number {k}", states[i], actions[i]) for i in range(2)]
        batch = {
            "tokenized_prompt": np.stack([t[0] for t in tok]).astype(np.int32),
            "tokenized_prompt_mask": np.stack([t[1] for t in tok]).astype(bool),
            "token_ar_mask": np.stack([t[2] for t in tok]).astype(np.int32),
            "token_loss_mask": np.stack([t[3] for t in tok]).astype(bool),
        }
        for key, v in batch.items():
            tensors[f"train_steps/step{k}/{key}"] = v
        obs = model_mod.Observation(images=images, image_masks=masks, state=states.astype(np.float32), **batch)

        def loss_fn(p):
            m = nnx.merge(graphdef, p, rest)
            return jnp.mean(m.compute_loss(jax.random.key(k), obs, actions.astype(np.float32), train=False))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        losses.append(float(loss))
        norms.append(float(optax.global_norm(grads)))
        lrs.append(float(schedule(k)))
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda old, new: EMA_DECAY * old + (1 - EMA_DECAY) * new, ema, params)
    tensors["train_steps/loss"] = np.array(losses, np.float32)
    tensors["train_steps/grad_norm"] = np.array(norms, np.float32)
    tensors["train_steps/lr"] = np.array(lrs, np.float32)
    for prefix, state in (("final", params), ("ema", ema)):
        for name, value in to_pytorch(flat_params(state), SIGLIP["depth"], GEMMA["depth"], GEMMA).items():
            tensors[f"train_steps/{prefix}/{name}"] = value
    return {"steps": TRAIN_STEPS, "lr_schedule": LR, "optimizer": ADAMW, "ema_decay": EMA_DECAY, "loss": losses,
            "grad_norm": norms, "lr": lrs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--openpi", required=True, help="openpi's .git or bare repository")
    parser.add_argument("--spm", required=True, help="../shared/fixtures/openpi/tokenizer_spm.model")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_platforms", "cpu")
    src = extract_openpi(args.openpi, tempfile.mkdtemp(prefix="openpi_src_"))
    sys.path.insert(0, src)
    install_stubs()
    import flax.nnx as nnx
    import jax.numpy as jnp

    import openpi.models.gemma_fast as gemma_fast
    import openpi.models.model as model_mod
    import openpi.models.pi0_fast as pi0_fast
    import openpi.models.siglip as siglip

    # Tiny dimensions (see the docstring): gemma_fast's config, siglip's factory, the image resolution.
    tiny = dict(variant="gemma_2b", **GEMMA, norm_eps=1e-6, vocab_size=793, scan=True, remat_policy="none")
    import ml_collections

    gemma_fast.get_config = lambda variant: ml_collections.ConfigDict(tiny)
    base_module = siglip.Module
    siglip.Module = lambda num_classes=None, *, variant=None, **kw: base_module(
        num_classes, variant="So400m/14", **{**kw, **SIGLIP})
    model_mod.IMAGE_RESOLUTION = (IMAGE, IMAGE)
    model_mod.preprocess_observation.__kwdefaults__["image_resolution"] = (IMAGE, IMAGE)

    tok_mod = tokref.load_openpi_tokenizer(
        tokref.read_openpi(args.openpi, tokref.TOKENIZER_PATH, tokref.TOKENIZER_BLOB), args.spm)
    fast_tok = tok_mod.FASTTokenizer(max_len=MAX_LEN, fast_tokenizer_path=tokref.FAST_DIR)
    proc = json.load(open(os.path.join(tokref.FAST_DIR, "processor_config.json")))
    h, d = proc["time_horizon"], proc["action_dim"]

    config = pi0_fast.Pi0FASTConfig(dtype="float32", action_dim=d, action_horizon=h, max_token_len=MAX_LEN)
    model = config.create(jax.random.key(0))
    # Seeded random parameters everywhere (openpi zero-initializes the embedding, Einsums, norms and the SigLIP head).
    rng = np.random.default_rng(4507)
    graphdef, state = nnx.split(model)
    flat_state = state.flat_state()
    params = {}
    for path, var in flat_state.items():
        name = "/".join(str(p) for p in path)
        shape = var.value.shape
        if "LayerNorm" in name or "encoder_norm" in name:
            value = (1.0 if name.endswith("scale") else 0.0) + 0.1 * rng.standard_normal(shape)
        elif name.endswith("scale"):  # Gemma RMSNorm: x * (1 + scale)
            value = 0.2 * rng.standard_normal(shape)
        elif "input_embedding" in name:  # unit-norm rows: no token wins greedy decoding by its norm alone
            value = rng.standard_normal(shape)
            value /= np.linalg.norm(value, axis=-1, keepdims=True)
        else:
            fan_in = shape[-2] if len(shape) >= 2 else 1
            value = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
            if name.endswith("bias"):
                value = 0.1 * rng.standard_normal(shape)
        var.value = jnp.asarray(value, jnp.float32)
        params[name.removeprefix("PaliGemma/")] = np.asarray(var.value)
    model = nnx.merge(graphdef, state)
    weights = to_pytorch(dict(params), SIGLIP["depth"], GEMMA["depth"], GEMMA)

    # Inputs.
    prompts = ["pick up the red block", "Open_The_Drawer"]
    states = [np.round(rng.uniform(-1, 1, size=d), 4), np.round(rng.uniform(-1, 1, size=d), 4)]
    actions = [tokref.smooth(rng, h, d), tokref.smooth(rng, h, d, 0.5)]
    tok = [fast_tok.tokenize(p, s, a) for p, s, a in zip(prompts, states, actions)]
    batch = {
        "tokenized_prompt": np.stack([t[0] for t in tok]).astype(np.int32),
        "tokenized_prompt_mask": np.stack([t[1] for t in tok]).astype(bool),
        "token_ar_mask": np.stack([t[2] for t in tok]).astype(np.int32),
        "token_loss_mask": np.stack([t[3] for t in tok]).astype(bool),
    }
    # Inference prefix: the prompt without actions.
    infer_tok = [fast_tok.tokenize(p, s, None) for p, s in zip(prompts, states)]
    infer = {
        "tokenized_prompt": np.stack([t[0] for t in infer_tok]).astype(np.int32),
        "tokenized_prompt_mask": np.stack([t[1] for t in infer_tok]).astype(bool),
        "token_ar_mask": np.stack([t[2] for t in infer_tok]).astype(np.int32),
        "token_loss_mask": np.stack([t[3] for t in infer_tok]).astype(bool),
    }
    images = {c: rng.uniform(-1, 1, size=(2, IMAGE, IMAGE, 3)).astype(np.float32) for c in CAMERAS}
    state_b = np.stack(states).astype(np.float32)
    actions_b = np.stack(actions).astype(np.float32)

    captured = {}
    real_log_softmax = jax.nn.log_softmax

    def log_softmax(x, *a, **k):
        captured["logits"] = np.asarray(x)
        return real_log_softmax(x, *a, **k)

    class ArgmaxRecorder:
        """jnp for pi0_fast.py, recording what argmax is taken of (one entry per decoding step)."""

        def __getattr__(self, name):
            return getattr(jnp, name)

        def argmax(self, x, *a, **k):
            captured.setdefault("step_logits", []).append(np.asarray(x))
            return jnp.argmax(x, *a, **k)

    tensors = {"images/" + c: images[c] for c in CAMERAS}
    tensors.update({"train/" + k: v for k, v in batch.items()})
    tensors.update({"infer/" + k: v for k, v in infer.items()})
    tensors["state"] = state_b
    tensors["actions"] = actions_b
    cases = {}
    for case in ("all_cameras", "masked_camera", "eos_one_row", "eos_all_rows"):
        masks = {c: np.ones(2, bool) for c in CAMERAS}
        if case != "all_cameras":
            masks["wrist_0_rgb"] = np.array([True, False])
        m = model
        if case.startswith("eos"):
            # EOS's embedding row becomes 1.5 x the row of the token greedy decoding chose first in row 0 (and, for
            # eos_all_rows, plus 3 x row 1's): EOS then wins in row 0 only (which keeps decoding: openpi stops only
            # when every row emits EOS at the same step), or in both rows at the first step (the stop).
            first = [int(t[0]) for t in cases["masked_camera"]["output_tokens"]]
            g, st = nnx.split(model)
            emb = st["PaliGemma"]["llm"]["embedder"]["input_embedding"]
            row = 1.5 * emb.value[first[0]] + (3.0 * emb.value[first[1]] if case == "eos_all_rows" else 0.0)
            emb.value = emb.value.at[1].set(row)
            m = nnx.merge(g, st)
            tensors[f"{case}/eos_embedding_row"] = np.asarray(row, np.float32)
        obs_train = model_mod.Observation(images=images, image_masks=masks, state=state_b, **batch)
        obs_infer = model_mod.Observation(images=images, image_masks=masks, state=state_b, **infer)
        captured.clear()
        jax.nn.log_softmax = log_softmax
        loss = np.asarray(m.compute_loss(jax.random.key(1), obs_train, actions_b, train=False))
        jax.nn.log_softmax = real_log_softmax
        logits = captured.pop("logits")  # [B, L-1, V]
        target_mask = batch["token_loss_mask"][:, 1:]
        pi0_fast.jnp = ArgmaxRecorder()
        with jax.disable_jit():
            out_tokens = np.asarray(m.sample_actions(jax.random.key(2), obs_infer, max_decoding_steps=STEPS,
                                                     temperature=0.0))
        pi0_fast.jnp = jnp
        steps = [s[:, 0, :] for s in captured.pop("step_logits")]  # each [B, V] (last_logit is [B, 1, V])
        step_logits = np.stack(steps, axis=1)  # [B, n_steps, V]
        top2 = np.sort(step_logits, axis=-1)[..., -2:]
        tensors[f"{case}/loss"] = loss.astype(np.float32)
        tensors[f"{case}/target_logits"] = logits[target_mask].astype(np.float32)  # [n_targets, V]
        tensors[f"{case}/output_tokens"] = out_tokens.astype(np.int64)
        tensors[f"{case}/step_logits"] = step_logits.astype(np.float32)
        tensors[f"{case}/image_masks"] = np.stack([masks[c] for c in CAMERAS], axis=1)
        cases[case] = {"loss": loss.tolist(), "steps_run": int(step_logits.shape[1]),
                       "min_margin": float((top2[..., 1] - top2[..., 0]).min()),
                       "output_tokens": out_tokens.astype(int).tolist()}
        print(case, cases[case], file=sys.stderr)
    train = train_reference(model, nnx, jax, jnp, model_mod, fast_tok, images, rng, h, d, tensors)
    print("train", train["loss"], file=sys.stderr)
    os.makedirs(OUT, exist_ok=True)
    write_safetensors(os.path.join(OUT, "model_weights.safetensors"), weights)
    write_safetensors(os.path.join(OUT, "model_cases.safetensors"), tensors)
    meta = {
        "what": "openpi Pi0FAST compute_loss, its log-softmax input at loss-masked targets, and greedy sample_actions "
                "(tokens, per-step logits) at tiny dimensions; see tests/data/pi0_fast_model_reference.py",
        "openpi_commit": tokref.OPENPI_COMMIT,
        "versions": {"jax": jax.__version__, "flax": __import__("flax").__version__, "numpy": np.__version__},
        "gemma": {**GEMMA, "vocab_size": 793}, "siglip": {**SIGLIP, "patch_size": 14, "image_size": IMAGE},
        "cameras": list(CAMERAS), "max_token_len": MAX_LEN, "max_decoding_steps": STEPS, "h": h, "d": d,
        "cases": cases, "train": train,
    }
    with open(os.path.join(OUT, "model.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
