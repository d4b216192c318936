#include "pi0/model/fused_inference.h"

#include <torch/version.h>

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/nn/attention_mask.h"
#include "pi0/nn/matmul.h"

// at::rms_norm (LibTorch >= 2.4; on CUDA one fused kernel from 2.8): float32 inside for bf16 input, one rounding.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define PI0_HAVE_RMS_NORM 1
#else
#define PI0_HAVE_RMS_NORM 0
#endif

namespace pi0::model {

namespace {

torch::ScalarType accumulation(torch::ScalarType compute) {
  return compute == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// The linear a Dense computes, as one [out, in] matrix in `acc`: weight + scaling · B·A when it has LoRA factors.
torch::Tensor effective_weight(nn::DenseImpl& d, torch::ScalarType acc) {
  auto w = d.weight.detach().to(acc);
  if (d.has_lora()) w = w + torch::matmul(d.lora_b.detach().to(acc), d.lora_a.detach().to(acc)) * d.lora_scaling;
  return w;
}

// A Dense's weight in `dtype`: the model's own tensor when it already is (no copy), else a cast.
torch::Tensor weight_in(nn::DenseImpl& d, torch::ScalarType dtype) {
  if (d.has_lora()) return effective_weight(d, accumulation(dtype)).to(dtype);
  return d.weight.detach().to(dtype);
}

// w [out, in] with column i multiplied by the plain RMSNorm's (1 + weight_i); an adaptive norm has no fixed scale.
torch::Tensor fold_norm(const torch::Tensor& w, nn::RMSNormImpl& norm) {
  if (norm.adaptive()) return w;
  return w * (1.0 + norm.weight.detach().to(w.scalar_type())).unsqueeze(0);
}

FusedLayer fuse_layer(GemmaDecoderLayerImpl& layer, const GemmaOptions& o, torch::ScalarType dtype) {
  const auto acc = accumulation(dtype);
  auto& attn = *layer.self_attn;
  auto& mlp = *layer.mlp;
  FusedLayer f;
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  f.qkv = fold_norm(torch::cat({effective_weight(*attn.q_proj, acc) * q_scale, effective_weight(*attn.k_proj, acc),
                                effective_weight(*attn.v_proj, acc)},
                               0),
                    *layer.input_layernorm)
              .to(dtype)
              .contiguous();
  f.o = weight_in(*attn.o_proj, dtype);
  f.gate_up = fold_norm(torch::cat({effective_weight(*mlp.gate_proj, acc), effective_weight(*mlp.up_proj, acc)}, 0),
                        *layer.post_attention_layernorm)
                  .to(dtype)
                  .contiguous();
  f.down = weight_in(*mlp.down_proj, dtype);
  f.eps_in = layer.input_layernorm->options.eps();
  f.eps_post = layer.post_attention_layernorm->options.eps();
  return f;
}

// n = x / sqrt(mean(x²) + eps), in float32 (float64 stays float64).
torch::Tensor rms32(const torch::Tensor& x, double eps) {
  const auto x32 = nn::upcast(x);
#if PI0_HAVE_RMS_NORM
  return at::rms_norm(x32, {x32.size(-1)}, c10::nullopt, eps);
#else
  return x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
#endif
}

// The plain norm without its scale (folded into the next linear), in x's dtype.
torch::Tensor rms_unscaled(const torch::Tensor& x, double eps) {
#if PI0_HAVE_RMS_NORM
  // bf16 in, float32 inside, one rounding out: the same arithmetic in one call (one kernel on CUDA >= 2.8).
  if (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf)
    return at::rms_norm(x, {x.size(-1)}, c10::nullopt, eps);
#endif
  return rms32(x, eps).to(x.scalar_type());
}

// The adaptive norm with its per-timestep modulation: n·(1 + scale) + shift, in x's dtype.
torch::Tensor ada_norm(const torch::Tensor& x, double eps, const torch::Tensor& scale1, const torch::Tensor& shift) {
  return torch::addcmul(shift, rms32(x, eps), scale1).to(x.scalar_type());
}

// One expert layer over the residual stream x [B,T,W]. With `cache_out` this pass's keys and values are appended to
// it, and with `kv_only` nothing after them is computed (the prefix pass's last layer: no one reads its output).
// `time`: the adaptive norms' modulation (pi0.5's action expert), index 2l and 2l+1.
// `grouped_bias`, when defined, sends the attention through grouped_attention instead of joint_attention.
torch::Tensor layer_forward(const FusedLayer& f, const GemmaOptions& o, const torch::Tensor& x,
                            const nn::RotaryTables& rope, const torch::Tensor& mask, const torch::Tensor& grouped_bias,
                            const torch::Tensor& k_cache, const torch::Tensor& v_cache, const TimeBranch* time,
                            size_t l, KVCache* cache_out, bool kv_only) {
  const int64_t b = x.size(0), t = x.size(1), n = o.num_heads, kv = o.num_kv_heads, d = o.head_dim;
  const auto h = time ? ada_norm(x, f.eps_in, time->scale1[2 * l], time->shift[2 * l]) : rms_unscaled(x, f.eps_in);
  const auto qkv = nn::linear(h, f.qkv);  // [B,T,(N+2K)·D]
  // q and k rotate together (RoPE is per head); q arrives scaled.
  const auto qk = nn::apply_rope(qkv.narrow(-1, 0, (n + kv) * d).view({b, t, n + kv, d}), rope);
  const auto q = qk.narrow(2, 0, n);
  auto k = qk.narrow(2, n, kv);
  auto v = qkv.narrow(-1, (n + kv) * d, kv * d).view({b, t, kv, d});
  if (cache_out) {
    cache_out->k.push_back(k.contiguous());
    cache_out->v.push_back(v.contiguous());
    if (kv_only) return {};
  }
  if (k_cache.defined()) {
    k = torch::cat({k_cache, k}, 1);
    v = torch::cat({v_cache, v}, 1);
  }
  const auto attn = grouped_bias.defined() ? grouped_attention(q, k, v, grouped_bias) : joint_attention(q, k, v, mask);
  const auto out = nn::linear(attn, f.o);
  // Gated residuals as one addcmul (x + out·gate, rounded once) instead of a product and a sum.
  const auto x1 = time ? torch::addcmul(x, out, time->gate[2 * l]) : x + out;
  const auto h2 = time ? ada_norm(x1, f.eps_post, time->scale1[2 * l + 1], time->shift[2 * l + 1])
                       : rms_unscaled(x1, f.eps_post);
  const auto gu = nn::linear(h2, f.gate_up);  // [B,T,2F]
  const int64_t mlp = f.down.size(1);
  const auto y = nn::linear(nn::gelu_tanh(gu.narrow(-1, 0, mlp)) * gu.narrow(-1, mlp, mlp), f.down);
  return time ? torch::addcmul(x1, y, time->gate[2 * l + 1]) : x1 + y;
}

torch::Tensor mask_for(Pi0Impl& m, const torch::Tensor& mask, torch::ScalarType dtype) {
  return m.uses_sdpa(mask.device()) ? attention_bias(mask, dtype) : mask;
}

}  // namespace

FusedWeights fuse_weights(Pi0Impl& m, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const auto acc = accumulation(dtype);
  const auto& o = m.options();
  auto& pwe = *m.paligemma_with_expert;
  FusedWeights f;
  f.dtype = dtype;
  for (int64_t l = 0; l < pwe.language_model->options.depth; ++l) {
    f.prefix.push_back(fuse_layer(*pwe.language_model->layers[l], pwe.language_model->options, dtype));
    f.suffix.push_back(fuse_layer(*pwe.expert->layers[l], pwe.expert->options, dtype));
  }
  f.out_w = fold_norm(effective_weight(*m.action_out_proj, acc), *pwe.expert->norm).contiguous();
  f.out_b = m.action_out_proj->bias.detach().to(acc);
  f.eps_final = pwe.expert->norm->options.eps();
  if (!o.pi05) {
    // action_time_mlp_in([action_in_proj(x) ; temb]) = W_a·(W_x·x + b_x) + W_t·temb + b = (W_a·W_x)·x + W_t·temb +
    // (W_a·b_x + b): the first product is one [We,A] matrix, the rest a bias per timestep.
    const int64_t we = o.action_expert.width;
    const auto w_in = effective_weight(*m.action_time_mlp_in, acc);
    const auto w_a = w_in.narrow(1, 0, we), w_t = w_in.narrow(1, we, we);
    f.action_w = torch::matmul(w_a, effective_weight(*m.action_in_proj, acc)).contiguous();
    f.time_w = w_t.contiguous();
    f.time_b = torch::mv(w_a, m.action_in_proj->bias.detach().to(acc)) + m.action_time_mlp_in->bias.detach().to(acc);
  }
  return f;
}

std::vector<std::pair<const void*, int64_t>> weights_signature(torch::nn::Module& m) {
  std::vector<std::pair<const void*, int64_t>> sig;
  for (const auto& p : m.parameters()) sig.emplace_back(p.data_ptr(), p._version());
  return sig;
}

TimeBranch time_branch(Pi0Impl& m, const FusedWeights& f, const torch::Tensor& time) {
  torch::NoGradGuard no_grad;  // a function of the time only: never differentiated (guided RTC's VJP is in x)
  const auto& o = m.options();
  const auto acc = accumulation(f.dtype);
  auto temb = nn::posemb_sincos(time.to(acc), o.action_expert.width);  // [B,We] or [B,H,We]
  if (temb.dim() == 2) temb = temb.unsqueeze(1);
  TimeBranch tb;
  if (!o.pi05) {
    tb.action_bias = nn::linear(temb, f.time_w, f.time_b);
    return tb;
  }
  const auto cond = torch::silu(m.time_mlp_out->forward(torch::silu(m.time_mlp_in->forward(temb))));
  auto& expert = *m.paligemma_with_expert->expert;
  const auto add = [&](nn::RMSNormImpl& norm) {
    const auto parts = norm.dense->forward(cond).chunk(3, -1);  // scale, shift, gate
    tb.scale1.push_back(1.0 + parts[0]);
    tb.shift.push_back(parts[1]);
    tb.gate.push_back(parts[2].to(f.dtype));
  };
  for (auto& layer : expert.layers) {
    add(*layer->input_layernorm);
    add(*layer->post_attention_layernorm);
  }
  add(*expert.norm);
  return tb;
}

const std::vector<TimeBranch>& schedule_branches(Pi0Impl& m, FusedWeights& f, int64_t num_steps, int64_t batch,
                                                 const torch::Device& device) {
  auto& branches = f.schedules[{num_steps, batch}];
  if (branches.empty()) {
    const auto opts = torch::TensorOptions().dtype(accumulation(f.dtype)).device(device);
    const float dt = -1.0f / static_cast<float>(num_steps);  // the sampler's float32 time
    float t = 1.0f;
    for (int64_t step = 0; step < num_steps; ++step, t += dt)
      branches.push_back(time_branch(m, f, torch::full({batch}, t, opts)));
  }
  return branches;
}

SuffixContext suffix_context(Pi0Impl& m, const torch::Tensor& prefix_pad_mask, const torch::Tensor& state,
                             int64_t batch, const torch::Device& device) {
  const auto& o = m.options();
  const int64_t b = batch, h = o.action_horizon, ts = o.pi05 ? h : h + 1;
  const auto acc = accumulation(m.compute_dtype());
  const auto bools = torch::TensorOptions().dtype(torch::kBool).device(device);
  // As embed_suffix: every suffix token valid; ar starts a causal block at the state token (pi0) and at action 0.
  const auto pad = torch::ones({b, ts}, bools);
  auto ar = torch::zeros({ts}, bools);
  ar.narrow(0, 0, ts - h + 1).fill_(true);
  const auto mask = nn::make_cached_attn_mask(prefix_pad_mask, pad, ar);
  const auto positions = nn::positions_after(prefix_pad_mask, pad);
  SuffixContext ctx;
  ctx.mask = mask_for(m, mask, m.compute_dtype());
  if (device.is_cuda() && ctx.mask.scalar_type() != torch::kBool) {
    const auto& e = o.action_expert;
    const int64_t kv = e.num_kv_heads, g = e.num_heads / e.num_kv_heads, s = ctx.mask.size(-1);
    ctx.grouped_bias = ctx.mask.view({b, 1, 1, ts, s}).expand({b, kv, g, ts, s}).reshape({b * kv, g * ts, s});
  }
  ctx.rope = nn::rotary_tables(nn::rope_tables(positions, o.action_expert.head_dim, acc));
  if (!o.pi05) ctx.state_token = m.state_proj->forward(state.to(acc)).unsqueeze(1);
  return ctx;
}

torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& grouped_bias) {
  const int64_t b = q.size(0), t = q.size(1), n = q.size(2), d = q.size(3), s = k.size(1), kv = k.size(2), g = n / kv;
  PI0_CHECK(grouped_bias.size(0) == b * kv && grouped_bias.size(1) == g * t && grouped_bias.size(2) == s,
            "grouped attention bias ", grouped_bias.sizes(), " does not match B·K=", b * kv, " G·T=", g * t, " S=", s);
  // Head n = kv_head·G + g (HF repeat_kv); each kv head's queries stacked along the rows.
  const auto qg = q.view({b, t, kv, g, d}).permute({0, 2, 3, 1, 4}).reshape({b * kv, g * t, d});
  const auto kg = k.permute({0, 2, 1, 3}).reshape({b * kv, s, d});
  const auto vg = v.permute({0, 2, 1, 3}).reshape({b * kv, s, d});
  const auto probs = torch::softmax(torch::baddbmm(grouped_bias, qg, kg.transpose(1, 2)), -1);
  return torch::bmm(probs, vg).view({b, kv, g, t, d}).permute({0, 3, 1, 2, 4}).reshape({b, t, n * d});
}

KVCache fused_prefix_cache(Pi0Impl& m, const FusedWeights& f, const Pi0Impl::Embedded& prefix) {
  const auto& o = m.paligemma_with_expert->language_model->options;
  const auto mask = mask_for(m, nn::make_attn_mask(prefix.pad_mask, prefix.ar_mask), f.dtype);
  const auto rope = nn::rotary_tables(
      nn::rope_tables(nn::positions_from_mask(prefix.pad_mask), o.head_dim, accumulation(f.dtype)));
  KVCache cache;
  auto x = prefix.embs;
  for (size_t l = 0; l < f.prefix.size(); ++l)
    x = layer_forward(f.prefix[l], o, x, rope, mask, {}, {}, {}, nullptr, l, &cache, l + 1 == f.prefix.size());
  return cache;
}

torch::Tensor fused_velocity(Pi0Impl& m, const FusedWeights& f, const KVCache& cache, const SuffixContext& ctx,
                             const torch::Tensor& x, const TimeBranch& time) {
  const auto& o = m.options();
  const auto& e = m.paligemma_with_expert->expert->options;
  const int64_t b = x.size(0), h = o.action_horizon;
  PI0_CHECK(x.dim() == 3 && x.size(1) == h && x.size(2) == o.action_dim, "x must be [B,", h, ",", o.action_dim,
            "], got ", x.sizes());
  const auto x32 = nn::upcast(x);
  torch::Tensor embs;
  if (o.pi05) {
    embs = m.action_in_proj->forward(x32);
  } else {
    const auto action_time = m.action_time_mlp_out->forward(torch::silu(nn::linear(x32, f.action_w) + time.action_bias));
    embs = torch::cat({ctx.state_token.expand({b, 1, e.width}), action_time}, 1);
  }
  auto stream = embs.to(f.dtype);
  for (size_t l = 0; l < f.suffix.size(); ++l)
    stream = layer_forward(f.suffix[l], e, stream, ctx.rope, ctx.mask, ctx.grouped_bias, cache.k.at(l), cache.v.at(l),
                           o.pi05 ? &time : nullptr, l, nullptr, false);
  // Only the action tokens' outputs are read.
  const auto actions = stream.narrow(1, stream.size(1) - h, h);
  const auto normed = o.pi05 ? ada_norm(actions, f.eps_final, time.scale1.back(), time.shift.back())
                             : rms_unscaled(actions, f.eps_final);
  return nn::linear(nn::upcast(normed), f.out_w, f.out_b);
}

}  // namespace pi0::model
