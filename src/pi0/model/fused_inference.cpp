#include "pi0/model/fused_inference.h"

#include <torch/version.h>

#include <cmath>
#include <limits>

#include "pi0/common/check.h"
#include "pi0/nn/attention_mask.h"
#include "pi0/nn/fp8.h"
#include "pi0/nn/fused_kernels.h"
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

// x + a·wᵀ with the residual add inside the GEMM (addmm, beta 1): in place on x's storage when nothing is
// differentiated, so the add is no kernel of its own, and one bf16 rounding of the sum instead of two. On the CPU a
// bf16 sum goes through float32 (nn/matmul.h: LibTorch's CPU GEMMs need not accumulate bf16 in float32), the
// same one rounding. Under autograd (guided real-time chunking) out of place: x was saved by the norm before it.
torch::Tensor add_linear(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& w) {
  PI0_CHECK(x.is_contiguous(), "the residual stream must be contiguous");
  const auto x2 = x.view({-1, x.size(-1)});
  const auto a2 = a.reshape({-1, a.size(-1)});
  const bool grad = torch::GradMode::is_enabled();
  if (nn::needs_float32_accumulation(x)) {
    const auto sum = torch::addmm(x2.to(torch::kFloat32), a2.to(torch::kFloat32), w.to(torch::kFloat32).t());
    if (grad) return sum.to(x.scalar_type()).view(x.sizes());
    x2.copy_(sum);
    return x;
  }
  if (grad) return torch::addmm(x2, a2, w.t()).view(x.sizes());
  x2.addmm_(a2, w.t());
  return x;
}

// One layer over the residual stream x [B,T,W] (contiguous; updated in place unless autograd is on). Its keys and
// values go into rows [row0, row0+T) of `kv_buf` [B,S,2K,D] (keys then values in each row), its queries attend
// rows [0, row0+T). With `kv_only` nothing after the keys and values is computed (a pass's last layer whose output no one
// reads). `time`: the adaptive norms' modulation (pi0.5's action expert), index 2l and 2l+1.
// Kernels per layer on a GPU without autograd (kv = 1, plain norms): norm, QKV GEMM, RoPE into q's grouped layout
// and the K/V buffer (nn::rope_scatter), logits GEMM, masked softmax, PV GEMM, O GEMM with the residual, norm,
// gate/up GEMM, GeGLU (nn::geglu), down GEMM with the residual: 11 (15 with ATen's composite where nvcc was not found).
torch::Tensor layer_forward(const FusedLayer& f, const GemmaOptions& o, torch::Tensor x, const FusedPass& p,
                            const torch::Tensor& kv_buf, const TimeBranch* time, size_t l, bool kv_only) {
  const int64_t b = x.size(0), t = x.size(1), n = o.num_heads, kv = o.num_kv_heads, d = o.head_dim, g = n / kv;
  const bool grad = torch::GradMode::is_enabled();
  // Our kernels are not differentiable: guided real-time chunking (autograd on) keeps ATen's composite.
  const bool own_kernels = !grad && nn::fused_kernels_available(x.device());
  // FP8 simulation (Pi0Impl::set_fp8_simulation): each GEMM's input quantized per token, as a scaled GEMM takes it.
  const auto in8 = [&](const torch::Tensor& a) { return f.fp8 ? nn::fake_quantize_e4m3_rows(a) : a; };
  const auto h = time ? ada_norm(x, f.eps_in, time->scale1[2 * l], time->shift[2 * l]) : rms_unscaled(x, f.eps_in);
  const auto qkv = nn::linear(in8(h), f.qkv).view({b, t, n + 2 * kv, d});  // q (scaled), k, v heads
  // q straight into the grouped layout [B,K,T,G,D] (t-major rows within each kv head), k and v into their rows.
  auto q = torch::empty({b, kv, t, g, d}, x.options());
  torch::Tensor kv_new;
  if (own_kernels) {
    // One kernel of ours for the composite's four (product, roll, two writes); no q for a pass's last layer.
    kv_new = kv_buf.narrow(1, p.row0, t);
    nn::rope_scatter(qkv, p.rope_half, n, kv_only ? torch::Tensor() : q, kv_new);
  } else {
    const auto factors = nn::rope_factors(qkv, p.rope);
    const auto q_rot = nn::rope_heads(factors, 0, n, q.permute({0, 2, 1, 3, 4}));
    if (grad) q = q_rot.view({b, t, kv, g, d}).permute({0, 2, 1, 3, 4});
    kv_new = nn::rope_heads(factors, n, 2 * kv, kv_buf.narrow(1, p.row0, t));
  }
  if (kv_only) return {};
  // Under autograd the new rows are concatenated instead (a buffer written in place would carry this step's graph
  // into the next).
  const auto keys = grad ? torch::cat({kv_buf.narrow(1, 0, p.row0), kv_new}, 1) : kv_buf.narrow(1, 0, p.row0 + t);
  const auto k = keys.narrow(2, 0, kv), v = keys.narrow(2, kv, kv);
  torch::Tensor attn;
  if (p.masked.defined()) {
    attn = grouped_attention(q, k, v, p.masked);
  } else {
    const auto q_btnd = q.permute({0, 2, 1, 3, 4}).reshape({b, t, n, d});  // a view when kv = 1
    attn = joint_attention(q_btnd, k, v, p.mask);
  }
  // Gated residuals as one addcmul (x + out·gate, rounded once) instead of a product and a sum.
  auto x1 = time ? torch::addcmul(x, nn::linear(attn, f.o), time->gate[2 * l]) : add_linear(x, in8(attn), f.o);
  const auto h2 = time ? ada_norm(x1, f.eps_post, time->scale1[2 * l + 1], time->shift[2 * l + 1])
                       : rms_unscaled(x1, f.eps_post);
  const auto gu = nn::linear(in8(h2), f.gate_up);  // [B,T,2F]
  const int64_t mlp = f.down.size(1);
  // GeGLU in one kernel on the GPU. The CPU keeps ATen's two operations: their tanh is vectorized, our loop's is
  // not (pi0 configs/bench_cpu.yaml, 3 cameras, float32: 679 ms per call in nn::geglu against 117 ms + a product,
  // bench_infer --profile).
  const auto act = own_kernels && !x.is_cpu() ? nn::geglu(gu)
                                              : nn::gelu_tanh(gu.narrow(-1, 0, mlp)) * gu.narrow(-1, mlp, mlp);
  return time ? torch::addcmul(x1, nn::linear(act, f.down), time->gate[2 * l + 1]) : add_linear(x1, in8(act), f.down);
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
  if (m.fp8_simulation()) {
    // The weights as FP8 with one scale per output channel, after the folds (an FP8 path would quantize these).
    f.fp8_simulated = true;
    for (auto& layer : f.prefix) {
      for (auto* w : {&layer.qkv, &layer.o, &layer.gate_up, &layer.down}) *w = nn::fake_quantize_e4m3_rows(*w);
      layer.fp8 = true;
    }
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

namespace {

// The pass of `t_rows` tokens starting at mask row `r0` of `mask` [B,T,S] (true = attended) and `positions` [B,T],
// writing buffer rows from `row0` and attending rows [0, row0 + t_rows).
FusedPass make_pass(Pi0Impl& m, const GemmaOptions& o, const torch::Tensor& mask, const torch::Tensor& positions,
                    int64_t r0, int64_t t_rows, int64_t row0, bool grouped) {
  FusedPass p;
  p.row0 = row0;
  const auto rows = mask.narrow(1, r0, t_rows).narrow(2, 0, row0 + t_rows);
  if (grouped) {
    p.masked = grouped_mask(rows, o.num_kv_heads, o.num_heads / o.num_kv_heads);
  } else {
    p.mask = mask_for(m, rows, m.compute_dtype());
  }
  p.rope_half = nn::rope_tables(positions.narrow(1, r0, t_rows), o.head_dim, accumulation(m.compute_dtype()));
  p.rope = nn::rotary_tables(p.rope_half, o.num_heads + o.num_kv_heads, o.num_kv_heads);
  return p;
}

}  // namespace

SuffixContext suffix_context(Pi0Impl& m, const FusedWeights& f, const KVCache& cache,
                             const torch::Tensor& prefix_pad_mask, const torch::Tensor& state, int64_t batch,
                             const torch::Device& device) {
  torch::NoGradGuard no_grad;  // once per call; guided real-time chunking differentiates only the steps
  const auto& o = m.options();
  const auto& e = m.paligemma_with_expert->expert->options;
  const int64_t b = batch, h = o.action_horizon, ts = o.pi05 ? h : h + 1, tp = prefix_pad_mask.size(1);
  PI0_CHECK(cache.kv.size() == f.suffix.size() && cache.kv.at(0).size(1) == tp + ts,
            "the prefix cache was not made by fused_prefix_cache for this model");
  const auto acc = accumulation(m.compute_dtype());
  const auto bools = torch::TensorOptions().dtype(torch::kBool).device(device);
  // As embed_suffix: every suffix token valid; ar starts a causal block at the state token (pi0) and at action 0.
  const auto pad = torch::ones({b, ts}, bools);
  auto ar = torch::zeros({ts}, bools);
  ar.narrow(0, 0, ts - h + 1).fill_(true);
  const auto mask = nn::make_cached_attn_mask(prefix_pad_mask, pad, ar);  // [B,Ts,Tp+Ts]
  const auto positions = nn::positions_after(prefix_pad_mask, pad);
  SuffixContext ctx;
  // The action tokens' pass; they see the prefix's valid rows, pi0's state token and one another.
  ctx.actions = make_pass(m, e, mask, positions, ts - h, h, tp + ts - h, /*grouped=*/true);
  if (!o.pi05) {
    // pi0's state token sees only the prefix and itself and has no time input: its keys and values are the same in
    // every step, so they are computed here, once per call, into row Tp of each layer's buffer. Its own output is
    // never read.
    const auto state_pass = make_pass(m, e, mask, positions, 0, 1, tp, /*grouped=*/true);
    auto x = m.state_proj->forward(state.to(acc)).unsqueeze(1).to(f.dtype).contiguous();  // [B,1,We]
    for (size_t l = 0; l < f.suffix.size(); ++l)
      x = layer_forward(f.suffix[l], e, x, state_pass, cache.kv[l], nullptr, l, l + 1 == f.suffix.size());
  }
  return ctx;
}

torch::Tensor grouped_mask(const torch::Tensor& mask, int64_t kv, int64_t g) {
  PI0_CHECK(mask.dim() == 3 && mask.scalar_type() == torch::kBool, "grouped_mask takes a [B,T,S] bool mask");
  const int64_t b = mask.size(0), t = mask.size(1), s = mask.size(2);
  // Contiguous and of the logits' shape: what CUDA's one-kernel masked softmax takes (mask_type 2).
  return mask.logical_not().view({b, 1, t, 1, s}).expand({b, kv, t, g, s}).reshape({b * kv, t * g, s});
}

torch::Tensor grouped_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& masked) {
  const int64_t b = q.size(0), kv = q.size(1), t = q.size(2), g = q.size(3), d = q.size(4), s = k.size(1);
  PI0_CHECK(k.size(2) == kv && masked.size(0) == b * kv && masked.size(1) == t * g && masked.size(2) == s,
            "grouped attention: q ", q.sizes(), ", k ", k.sizes(), ", mask ", masked.sizes(), " do not match");
  // Head n = kv_head·G + g (HF repeat_kv): each kv head's queries are the rows of one GEMM. kv = 1 (every Gemma
  // variant here): q, k and v are views (k and v strided inside the K/V buffer), and the output's rows (t, g) are
  // already [B,T,N·D]: no layout copy on either side.
  const auto qg = q.reshape({b * kv, t * g, d});
  const auto kg = k.permute({0, 2, 1, 3}).reshape({b * kv, s, d});
  const auto vg = v.permute({0, 2, 1, 3}).reshape({b * kv, s, d});
  auto logits = nn::matmul(qg, kg.transpose(1, 2));  // [B·K, T·G, S]
  // True = not attended; every row keeps at least one key (its own token), so no row is all -inf.
  // CUDA: ATen's one-kernel masked softmax (float32 inside for bf16 logits). The CPU's kernel for it took 3.6× a
  // masked_fill_ + softmax (pi0 configs/bench_cpu.yaml, 3 cameras, float32: 415 ms against 72 + 115 ms per call,
  // bench_infer --profile), so the CPU takes those two.
  const auto softmax = [&](torch::Tensor x) {
    if (x.is_cuda()) return at::_masked_softmax(x, masked, 2, 2);
    return x.masked_fill_(masked, -std::numeric_limits<float>::infinity()).softmax(-1);
  };
  torch::Tensor probs;
  if (nn::needs_float32_accumulation(logits)) {
    // The CPU's bf16 kernel rounds inside (1 bf16 step from a float32 softmax, LibTorch 1.13): float32 as on CUDA.
    probs = softmax(logits.to(torch::kFloat32)).to(logits.scalar_type());
  } else {
    probs = softmax(logits);
  }
  const auto out = nn::matmul(probs, vg);  // [B·K, T·G, D]
  if (kv == 1) return out.view({b, t, g * d});
  return out.view({b, kv, t, g, d}).permute({0, 2, 1, 3, 4}).reshape({b, t, kv * g * d});
}

KVCache fused_prefix_cache(Pi0Impl& m, const FusedWeights& f, const Pi0Impl::Embedded& prefix) {
  const auto& o = m.paligemma_with_expert->language_model->options;
  const auto& e = m.paligemma_with_expert->expert->options;
  const int64_t b = prefix.embs.size(0), tp = prefix.embs.size(1);
  const int64_t ts = m.options().pi05 ? m.options().action_horizon : m.options().action_horizon + 1;
  PI0_CHECK(o.num_kv_heads == e.num_kv_heads && o.head_dim == e.head_dim,
            "the prefix and the action expert must share the kv heads' shape");
  // A padded token (prompt padding, a masked camera) attends nothing, and a row masked throughout is NaN in the
  // masked softmax (0/0; a large negative bias gave a uniform row): it attends itself instead. No valid token sees a
  // padded one, so what a padded row computes is never read, but its NaN would reach the valid rows as 0·NaN in P·V.
  const int64_t tq = prefix.pad_mask.size(1);
  const auto mask = nn::make_attn_mask(prefix.pad_mask, prefix.ar_mask) |
                    torch::eye(tq, prefix.pad_mask.options()).unsqueeze(0);
  // The grouped path (bmm, masked softmax, bmm) where the model computes attention explicitly; where it uses SDPA
  // (CUDA) the prefix's ~800 queries keep SDPA's fused kernel, which never writes the [T·N, S] logits out.
  const auto pass = make_pass(m, o, mask, nn::positions_from_mask(prefix.pad_mask), 0, tp, 0,
                              /*grouped=*/!m.uses_sdpa(prefix.embs.device()));
  KVCache cache;
  auto x = prefix.embs;  // embed_prefix's own tensor: the layers update it in place
  for (size_t l = 0; l < f.prefix.size(); ++l) {
    // Rows [0, Tp) are the prefix's; the suffix passes write theirs behind them, so no step concatenates the cache.
    cache.kv.push_back(torch::empty({b, tp + ts, 2 * o.num_kv_heads, o.head_dim}, x.options()));
    x = layer_forward(f.prefix[l], o, x, pass, cache.kv.back(), nullptr, l, l + 1 == f.prefix.size());
    const auto rows = cache.kv.back().narrow(1, 0, tp);
    cache.k.push_back(rows.narrow(2, 0, o.num_kv_heads));
    cache.v.push_back(rows.narrow(2, o.num_kv_heads, o.num_kv_heads));
  }
  return cache;
}

torch::Tensor fused_velocity(Pi0Impl& m, const FusedWeights& f, const KVCache& cache, const SuffixContext& ctx,
                             const torch::Tensor& x, const TimeBranch& time) {
  const auto& o = m.options();
  const int64_t h = o.action_horizon;
  PI0_CHECK(x.dim() == 3 && x.size(1) == h && x.size(2) == o.action_dim, "x must be [B,", h, ",", o.action_dim,
            "], got ", x.sizes());
  const auto& e = m.paligemma_with_expert->expert->options;
  const auto x32 = nn::upcast(x);
  // Only the action tokens: pi0's state token is in the cache already (suffix_context).
  const auto embs = o.pi05 ? m.action_in_proj->forward(x32)
                           : m.action_time_mlp_out->forward(torch::silu(nn::linear(x32, f.action_w) + time.action_bias));
  // A tensor of this pass's own (the layers update the stream in place), in the compute dtype.
  auto stream = embs.to(f.dtype).contiguous();
  for (size_t l = 0; l < f.suffix.size(); ++l)
    stream = layer_forward(f.suffix[l], e, stream, ctx.actions, cache.kv.at(l), o.pi05 ? &time : nullptr, l, false);
  const auto normed = o.pi05 ? ada_norm(stream, f.eps_final, time.scale1.back(), time.shift.back())
                             : rms_unscaled(stream, f.eps_final);
  return nn::linear(nn::upcast(normed), f.out_w, f.out_b);
}

}  // namespace pi0::model
