#include "pi0/model/pi0.h"

#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include "pi0/nn/sdpa.h"
#if defined(PI0_WITH_CUDA) && TORCH_VERSION_MAJOR >= 2
#define PI0_HAVE_CUDA_GRAPH 1
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#else
#define PI0_HAVE_CUDA_GRAPH 0
#endif

#include "pi0/common/check.h"
#include "pi0/common/profiler.h"
#include "pi0/model/flow_matching.h"
#include "pi0/model/fused_inference.h"
#include "pi0/nn/attention_mask.h"
#include "pi0/nn/checkpoint.h"
#include "pi0/nn/matmul.h"
#include "pi0/nn/rope.h"

namespace pi0::model {

Pi0Options pi0_options(bool pi05) {
  Pi0Options o;
  o.pi05 = pi05;
  o.max_token_len = pi05 ? 200 : 48;
  return o;
}

Pi0Options dummy_options(bool pi05, int64_t vocab_size, int64_t image_size) {
  Pi0Options o;
  o.pi05 = pi05;
  o.paligemma = gemma_variant("dummy");
  o.paligemma.vocab_size = vocab_size;
  o.action_expert = gemma_variant("dummy");
  o.siglip = siglip_variant("tiny/14");
  o.siglip.image_size = image_size;
  o.action_dim = 8;
  o.action_horizon = 4;
  o.max_token_len = 6;
  return o;
}

namespace {
std::shared_ptr<torch::nn::Module> holder(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}
}  // namespace

// ------------------------------------------------------------------------------------------------------------
// Joint attention and the two-expert stack.

bool sdpa_available() {
#if PI0_HAVE_SDPA
  return true;
#else
  return false;
#endif
}

AttentionImpl parse_attention_impl(const std::string& name, const std::string& key) {
  if (name == "auto") return AttentionImpl::kAuto;
  if (name == "explicit") return AttentionImpl::kExplicit;
  if (name == "sdpa") {
    if (!sdpa_available())
      throw UserError(key + " is 'sdpa' but this LibTorch (" TORCH_VERSION ") has no scaled_dot_product_attention "
                      "with a scale argument (needs >= 2.1); use 'auto' or 'explicit'");
    return AttentionImpl::kSdpa;
  }
  throw UserError(key + " must be auto, explicit or sdpa (got '" + name + "')");
}

torch::Tensor attention_bias(const torch::Tensor& mask, torch::ScalarType dtype) {
  PI0_CHECK(mask.dim() == 3 && mask.scalar_type() == torch::kBool, "attention_bias takes a [B,T,S] bool mask");
  return torch::zeros(mask.sizes(), mask.options().dtype(dtype))
      .masked_fill_(mask.logical_not(), nn::kMaskValue)
      .unsqueeze(1);
}

namespace {
#if PI0_HAVE_SDPA
// q [B,T,N,D] (already scaled), k/v [B,S,K,D], bias [B,1,T,S] → [B,T,N·D].
torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& bias) {
  const int64_t b = q.size(0), t = q.size(1), n = q.size(2), d = q.size(3), kv = k.size(2);
  auto q_bntd = q.transpose(1, 2);
  auto k_bksd = k.transpose(1, 2), v_bksd = v.transpose(1, 2);
  auto attn_bias = bias.to(q.scalar_type());
  // Grouped-query attention: head n uses kv head n / (N/K), as HF repeat_kv. The kv heads are repeated here rather
  // than with enable_gqa (LibTorch >= 2.5), which only the flash and math kernels take: flash takes no mask, and the
  // math kernel materializes the [B,N,T,S] logits this path exists to avoid.
  if (kv != n) {
    const int64_t s = k.size(1);
    k_bksd = k_bksd.unsqueeze(2).expand({b, kv, n / kv, s, d}).reshape({b, n, s, d});
    v_bksd = v_bksd.unsqueeze(2).expand({b, kv, n / kv, s, d}).reshape({b, n, s, d});
  }
  auto out = at::scaled_dot_product_attention(q_bntd, k_bksd, v_bksd, attn_bias, 0.0, false, 1.0);
  return out.transpose(1, 2).reshape({b, t, n * d});
}
#endif
}  // namespace

torch::Tensor joint_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& mask) {
  const int64_t b = q.size(0), t = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t s = k.size(1), kv = k.size(2), g = n / kv;
  PI0_CHECK(n % kv == 0, "query heads (", n, ") must be a multiple of kv heads (", kv, ")");
  PI0_CHECK(mask.size(-2) == t && mask.size(-1) == s, "attention mask ", mask.sizes(), " does not match T=", t,
            " S=", s);
  if (mask.scalar_type() != torch::kBool) {
#if PI0_HAVE_SDPA
    return sdpa_attention(q, k, v, mask);
#else
    PI0_CHECK(false, "an additive attention bias needs scaled_dot_product_attention (LibTorch >= 2.1)");
#endif
  }
  // Head n = kv_head·G + g shares kv_head (as HF repeat_kv); group queries so one matmul per kv head.
  auto q_bkgd = q.view({b, t, kv, g, d}).permute({0, 2, 3, 1, 4}).reshape({b, kv, g * t, d});
  auto k_bksd = k.permute({0, 2, 1, 3});
  auto v_bksd = v.permute({0, 2, 1, 3});
  auto logits = nn::upcast(nn::matmul(q_bkgd, k_bksd.transpose(-1, -2))).view({b, kv, g, t, s});
  // In place: the [B,K,G,T,S] float32 logits are the largest tensor of a layer, and neither matmul's nor the
  // fill's backward needs them.
  logits.masked_fill_(mask.logical_not().view({b, 1, 1, t, s}), nn::kMaskValue);
  auto probs = torch::softmax(logits, -1).to(q.scalar_type()).view({b, kv, g * t, s});
  auto out = nn::matmul(probs, v_bksd).view({b, kv, g, t, d});
  return out.permute({0, 3, 1, 2, 4}).reshape({b, t, n * d});
}

PaliGemmaWithExpertImpl::PaliGemmaWithExpertImpl(const Pi0Options& o) {
  const auto& p = o.paligemma;
  const auto& e = o.action_expert;
  if (!o.fast && (p.depth != e.depth || p.head_dim != e.head_dim || p.num_heads != e.num_heads ||
                  p.num_kv_heads != e.num_kv_heads)) {
    throw UserError("model.paligemma and model.action_expert must share depth, head_dim, num_heads and "
                    "num_kv_heads (joint attention)");
  }
  if (p.vocab_size <= 0) throw UserError("model.paligemma needs a token embedding (vocab_size > 0)");
  auto paligemma = holder(*this, "paligemma");
  auto pg_model = holder(*paligemma, "model");
  vision = holder(*pg_model, "vision_tower")->register_module("vision_model", Siglip(o.siglip));
  // openpi's SigLIP head (head_zeroinit=True): image tokens start at zero.
  projector = holder(*pg_model, "multi_modal_projector")
                  ->register_module("linear", nn::Dense(nn::DenseOptions(o.siglip.width, p.width).init("zeros")));
  auto prefix_opts = p;
  prefix_opts.cond_dim = 0;
  language_model = pg_model->register_module("language_model", GemmaModel(prefix_opts));
  if (o.fast) return;  // pi0-FAST: PaliGemma alone
  auto expert_opts = e;
  expert_opts.vocab_size = 0;
  expert_opts.cond_dim = o.pi05 ? e.width : 0;
  expert = holder(*this, "gemma_expert")->register_module("model", GemmaModel(expert_opts));
}

bool PaliGemmaWithExpertImpl::prefix_needs_grad(int64_t l, const torch::Tensor& prefix, const torch::Tensor& k_cache,
                                                const torch::Tensor& v_cache) {
  if (prefix.requires_grad() || (k_cache.defined() && k_cache.requires_grad()) ||
      (v_cache.defined() && v_cache.requires_grad()))
    return true;
  for (const auto& p : language_model->layers[l]->parameters())
    if (p.requires_grad()) return true;
  return false;
}

std::vector<torch::Tensor> PaliGemmaWithExpertImpl::layer_forward(int64_t l, const torch::Tensor& prefix,
                                                                  const torch::Tensor& suffix,
                                                                  const torch::Tensor& mask,
                                                                  const nn::RopeTables& rope,
                                                                  const torch::Tensor& cond,
                                                                  const torch::Tensor& k_cache,
                                                                  const torch::Tensor& v_cache) {
  const auto& o = language_model->options;
  const int64_t n = o.num_heads, kv = o.num_kv_heads, d = o.head_dim;
  GemmaDecoderLayer layers[2] = {language_model->layers[l], expert->layers[l]};
  torch::Tensor xs[2] = {prefix, suffix};
  torch::Tensor conds[2] = {torch::Tensor(), cond};
  torch::Tensor gates[2];
  std::vector<torch::Tensor> qs, ks, vs;
  std::vector<int64_t> lengths;
  for (int e = 0; e < 2; ++e) {
    if (!xs[e].defined()) continue;
    const int64_t b = xs[e].size(0), t = xs[e].size(1);
    auto [h, gate] = layers[e]->input_layernorm->forward(xs[e], conds[e]);
    gates[e] = gate;
    qs.push_back(layers[e]->self_attn->q_proj->forward(h).view({b, t, n, d}));
    ks.push_back(layers[e]->self_attn->k_proj->forward(h).view({b, t, kv, d}));
    vs.push_back(layers[e]->self_attn->v_proj->forward(h).view({b, t, kv, d}));
    lengths.push_back(t);
  }
  auto q = qs.size() == 1 ? qs[0] : torch::cat(qs, 1);
  auto k = ks.size() == 1 ? ks[0] : torch::cat(ks, 1);
  auto v = vs.size() == 1 ? vs[0] : torch::cat(vs, 1);
  // openpi scales q after RoPE.
  q = nn::apply_rope(q, rope) * (1.0 / std::sqrt(static_cast<double>(d)));
  k = nn::apply_rope(k, rope);
  const auto k_new = k, v_new = v;
  if (k_cache.defined()) {
    k = torch::cat({k_cache, k}, 1);
    v = torch::cat({v_cache, v}, 1);
  }
  auto attn = joint_attention(q, k, v, mask);
  auto parts = lengths.size() == 1 ? std::vector<torch::Tensor>{attn} : attn.split_with_sizes(lengths, 1);
  // The joint attention's output is one tensor, differentiable through the suffix's queries, keys and values, so
  // without this the prefix rows would record a graph from the first layer on (their o_proj, norms and MLP kept for
  // backward) even when nothing at or below them trains (train.freeze=action-expert-only). No prefix row sees a
  // suffix row (the prefix-LM mask), so their gradient through the attention is exactly zero: cutting them from the
  // graph changes no value and no gradient, only what backward keeps and computes.
  if (lengths.size() == 2 && torch::GradMode::is_enabled() && !prefix_needs_grad(l, prefix, k_cache, v_cache))
    parts[0] = parts[0].detach();
  size_t part = 0;
  torch::Tensor out[2];
  for (int e = 0; e < 2; ++e) {
    if (!xs[e].defined()) continue;
    auto x = xs[e];
    auto o_e = layers[e]->self_attn->o_proj->forward(parts[part++]);
    x = gates[e].defined() ? x + o_e * gates[e].to(o_e.scalar_type()) : x + o_e;
    auto [h2, gate2] = layers[e]->post_attention_layernorm->forward(x, conds[e]);
    auto y = layers[e]->mlp->forward(h2);
    out[e] = gate2.defined() ? x + y * gate2.to(y.scalar_type()) : x + y;
  }
  return {out[0], out[1], k_new, v_new};
}

PaliGemmaWithExpertImpl::Output PaliGemmaWithExpertImpl::forward(const torch::Tensor& prefix,
                                                                 const torch::Tensor& suffix,
                                                                 const torch::Tensor& mask,
                                                                 const torch::Tensor& positions,
                                                                 const torch::Tensor& cond,
                                                                 const KVCache* cache_in, KVCache* cache_out,
                                                                 int64_t checkpointed_layers) {
  PI0_CHECK(prefix.defined() || suffix.defined(), "joint forward needs at least one expert's input");
  auto x_prefix = prefix, x_suffix = suffix;
  const int64_t depth = language_model->options.depth;
  if (cache_out) cache_out->k.clear(), cache_out->v.clear();
  // RoPE depends on the positions only: one table for every layer (and every recomputation), held by value in the
  // checkpointed closures, which outlive this call.
  const auto rope = nn::rope_tables(positions, language_model->options.head_dim,
                                    nn::upcast(prefix.defined() ? prefix : suffix).scalar_type());
  for (int64_t l = 0; l < depth; ++l) {
    if (layer_gate) layer_gate(LayerStack::kJoint, l);
    torch::Tensor kc, vc;
    if (cache_in) kc = cache_in->k.at(l), vc = cache_in->v.at(l);
    std::vector<torch::Tensor> out;
    // The last layer is never checkpointed: backward starts there, so its recomputation would coexist with the
    // same activations anyway — keeping them costs no peak memory and saves one layer's recomputation.
    if (l < checkpointed_layers && l + 1 < depth) {
      auto params = language_model->layers[l]->parameters();
      for (const auto& p : expert->layers[l]->parameters()) params.push_back(p);
      // The cache goes in as inputs (not captured), so that a gradient reaching it (knowledge insulation off) flows
      // out of the recomputation; a cache_out is returned as outputs, so one that trains is differentiated too.
      const bool keep_kv = cache_out != nullptr;
      out = nn::checkpoint(
          [this, l, mask, rope, keep_kv](const nn::TensorList& in) {
            auto r = layer_forward(l, in[0], in[1], mask, rope, in[2], in[3], in[4]);
            return keep_kv ? r : nn::TensorList{r[0], r[1]};
          },
          {x_prefix, x_suffix, cond, kc, vc}, params);
    } else {
      out = layer_forward(l, x_prefix, x_suffix, mask, rope, cond, kc, vc);
    }
    if (cache_out) cache_out->k.push_back(out.at(2)), cache_out->v.push_back(out.at(3));
    // A checkpointed layer's outputs all require grad when any input does; its prefix output needs none when the
    // prefix did not (layer_forward cut it from the graph), and the next layer must see that.
    if (x_prefix.defined() && x_suffix.defined() && out[0].requires_grad() &&
        !prefix_needs_grad(l, x_prefix, kc, vc))
      out[0] = out[0].detach();
    x_prefix = out[0];
    x_suffix = out[1];
  }
  Output result;
  if (x_prefix.defined()) result.prefix = language_model->norm->forward(x_prefix).first;
  if (x_suffix.defined()) result.suffix = expert->norm->forward(x_suffix, cond).first;
  return result;
}

// ------------------------------------------------------------------------------------------------------------
// pi0 / pi0.5.

Pi0Impl::Pi0Impl(Pi0Options o) : options_(std::move(o)) {
  const int64_t we = options_.action_expert.width, a = options_.action_dim;
  paligemma_with_expert = register_module("paligemma_with_expert", PaliGemmaWithExpert(options_));
  if (options_.fast) {
    Pi0FastOptions fo;
    fo.paligemma = options_.paligemma;
    fo.siglip = options_.siglip;
    fo.action_dim = options_.action_dim;
    fo.action_horizon = options_.action_horizon;
    fo.max_token_len = options_.max_token_len;
    auto& pwe = *paligemma_with_expert;
    fast_ = Pi0Fast(fo, pwe.vision, pwe.projector, pwe.language_model);
    return;
  }
  action_in_proj = register_module("action_in_proj", nn::Dense(a, we));
  action_out_proj = register_module("action_out_proj", nn::Dense(we, a));
  if (options_.pi05) {
    time_mlp_in = register_module("time_mlp_in", nn::Dense(we, we));
    time_mlp_out = register_module("time_mlp_out", nn::Dense(we, we));
  } else {
    state_proj = register_module("state_proj", nn::Dense(a, we));
    action_time_mlp_in = register_module("action_time_mlp_in", nn::Dense(2 * we, we));
    action_time_mlp_out = register_module("action_time_mlp_out", nn::Dense(we, we));
  }
}

Pi0Impl::Embedded Pi0Impl::embed_prefix(const Observation& obs) {
  const int64_t n_cam = static_cast<int64_t>(obs.images.size());
  PI0_CHECK(n_cam > 0, "observation has no images");
  PI0_CHECK(obs.image_masks.size() == obs.images.size(), "one image mask per camera expected");
  const int64_t b = obs.images[0].size(0);
  auto& pwe = *paligemma_with_expert;
  // All cameras go through SigLIP as one batch.
  auto images = n_cam == 1 ? obs.images[0] : torch::cat(obs.images, 0);
  auto img_tokens = pwe.projector->forward(
      pwe.vision->forward(images, compute_dtype_, checkpointed_.vision, uses_sdpa(images.device())));
  const int64_t p = img_tokens.size(1);
  std::vector<torch::Tensor> embs, masks;
  for (int64_t c = 0; c < n_cam; ++c) {
    embs.push_back(img_tokens.narrow(0, c * b, b));
    masks.push_back(obs.image_masks[c].to(torch::kBool).view({b, 1}).expand({b, p}));
  }
  embs.push_back(pwe.language_model->embed(obs.tokenized_prompt.to(torch::kLong)).to(compute_dtype_));
  masks.push_back(obs.tokenized_prompt_mask.to(torch::kBool));
  Embedded out;
  out.embs = torch::cat(embs, 1);
  out.pad_mask = torch::cat(masks, 1);
  out.ar_mask = torch::zeros({out.embs.size(1)}, torch::TensorOptions().dtype(torch::kBool).device(out.embs.device()));
  return out;
}

Pi0Impl::Embedded Pi0Impl::embed_suffix(const torch::Tensor& state, const torch::Tensor& x_t,
                                        const torch::Tensor& time) {
  const int64_t b = x_t.size(0), h = x_t.size(1), we = options_.action_expert.width;
  // Projections run in float32 as in the reference (f32 kernels fed f32 inputs).
  auto action_tokens = action_in_proj->forward(nn::upcast(x_t));  // [B,H,We]
  PI0_CHECK(time.dim() == 1 || (time.dim() == 2 && time.size(1) == h), "time must be [B] or [B,", h, "], got ",
            time.sizes());
  const bool per_token = time.dim() == 2;
  auto time_emb = nn::posemb_sincos(time.to(nn::upcast(x_t).scalar_type()), we);  // [B,We] or [B,H,We]
  auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(x_t.device());
  Embedded out;
  if (options_.pi05) {
    out.cond = torch::silu(time_mlp_out->forward(torch::silu(time_mlp_in->forward(time_emb))));
    out.embs = action_tokens;
  } else {
    auto state_token = state_proj->forward(state.to(time_emb.scalar_type())).unsqueeze(1);  // [B,1,We]
    auto mixed = torch::cat({action_tokens, per_token ? time_emb : time_emb.unsqueeze(1).expand({b, h, we})}, -1);
    auto action_time = action_time_mlp_out->forward(torch::silu(action_time_mlp_in->forward(mixed)));
    out.embs = torch::cat({state_token, action_time}, 1);
  }
  const int64_t ts = out.embs.size(1);
  out.embs = out.embs.to(compute_dtype_);
  out.pad_mask = torch::ones({b, ts}, bool_opts);
  // ar: pi0 [state T, action0 T, rest F]; pi0.5 [action0 T, rest F] — each true starts a new causal block.
  out.ar_mask = torch::zeros({ts}, bool_opts);
  out.ar_mask.narrow(0, 0, ts - h + 1).fill_(true);
  return out;
}

void Pi0Impl::set_gradient_checkpointing(bool on) {
  const auto all = all_layers(options_);
  set_checkpointed_layers(on ? all.vision : 0, on ? all.language : 0);
}

void Pi0Impl::set_checkpointed_layers(int64_t vision, int64_t language) {
  const auto all = all_layers(options_);
  PI0_CHECK(vision >= 0 && vision <= all.vision && language >= 0 && language <= all.language,
            "checkpointed layers (", vision, " vision, ", language, " language) outside 0..", all.vision, " and 0..",
            all.language);
  checkpointed_ = {vision, language};
}

void Pi0Impl::set_layer_gate(LayerGate gate) {
  paligemma_with_expert->vision->layer_gate = gate;
  paligemma_with_expert->layer_gate = std::move(gate);
}

torch::Tensor Pi0Impl::velocity_full(const Embedded& prefix, const torch::Tensor& state, const torch::Tensor& x_t,
                                     const torch::Tensor& time) {
  auto suffix = embed_suffix(state, x_t, time);
  auto pad = torch::cat({prefix.pad_mask, suffix.pad_mask}, 1);
  auto ar = torch::cat({prefix.ar_mask, suffix.ar_mask}, 0);
  auto mask = attention_mask_for(nn::make_attn_mask(pad, ar), prefix.embs);
  auto positions = nn::positions_from_mask(pad);
  auto out = paligemma_with_expert->forward(prefix.embs, suffix.embs, mask, positions, suffix.cond, nullptr, nullptr,
                                            checkpointed_.language);
  const int64_t h = options_.action_horizon;
  return action_out_proj->forward(nn::upcast(out.suffix.narrow(1, out.suffix.size(1) - h, h)));
}

namespace {

// Flow matching's training pair for `actions` [B,H,A] (float32 or wider): time t [B] or [B,H] (drawn as
// sample_flow_time when not given), x_t = t·noise + (1 − t)·actions and the target velocity u_t = noise − actions.
struct FlowTargets {
  torch::Tensor t, x_t, u_t;
};
FlowTargets flow_targets(const torch::Tensor& actions, const std::optional<torch::Tensor>& noise,
                         const std::optional<torch::Tensor>& time, int64_t horizon) {
  const int64_t b = actions.size(0);
  auto a = nn::upcast(actions);
  auto eps = noise ? noise->to(a.scalar_type()) : torch::randn_like(a);
  auto t = time ? time->to(a.scalar_type()) : sample_flow_time(b, a.options());
  PI0_CHECK(t.dim() == 1 || (t.dim() == 2 && t.size(1) == horizon), "time must be [B] or [B,H], got ", t.sizes());
  auto t3 = t.dim() == 1 ? t.view({b, 1, 1}) : t.unsqueeze(-1);
  return {t, t3 * eps + (1.0 - t3) * a, eps - a};
}

}  // namespace

Pi0Fast& Pi0Impl::fast_view() {
  PI0_CHECK(options_.fast, "a pi0-FAST call on a pi0 / pi0.5 model");
  fast_->set_compute_dtype(compute_dtype_);
  fast_->set_checkpointed_layers(checkpointed_.vision, checkpointed_.language);
  return fast_;
}

Pi0FastImpl::Loss Pi0Impl::compute_fast_loss(const Observation& obs, const torch::Tensor& token_ar_mask,
                                             const torch::Tensor& token_loss_mask) {
  return fast_view()->compute_loss(obs, token_ar_mask, token_loss_mask);
}

Pi0FastImpl::Decoded Pi0Impl::sample_fast_tokens(const Observation& obs, const torch::Tensor& token_ar_mask,
                                                 int64_t max_decoding_steps, double temperature,
                                                 std::optional<at::Generator> generator) {
  return fast_view()->sample_tokens(obs, token_ar_mask, max_decoding_steps, temperature, std::move(generator));
}

torch::Tensor Pi0Impl::compute_loss(const Observation& obs, const torch::Tensor& actions,
                                    std::optional<torch::Tensor> noise, std::optional<torch::Tensor> time) {
  PI0_CHECK(!options_.fast, "pi0-FAST has no flow-matching loss (compute_fast_loss)");
  PI0_CHECK(actions.dim() == 3 && actions.size(1) == options_.action_horizon &&
                actions.size(2) == options_.action_dim,
            "actions must be [B,", options_.action_horizon, ",", options_.action_dim, "], got ", actions.sizes());
  const auto [t, x_t, u_t] = flow_targets(actions, noise, time, options_.action_horizon);
  auto prefix = embed_prefix(obs);
  auto v_t = velocity_full(prefix, obs.state, x_t, t);
  return (v_t - u_t).pow(2);
}

Pi0Impl::KiLoss Pi0Impl::compute_ki_loss(const Observation& obs, const torch::Tensor& actions,
                                         const torch::Tensor& fast_tokens, const torch::Tensor& fast_mask,
                                         bool stop_gradient, std::optional<torch::Tensor> noise,
                                         std::optional<torch::Tensor> time) {
  PrefixBlocks blocks;
  blocks.fast_tokens = fast_tokens;
  blocks.fast_mask = fast_mask;
  return compute_prefix_loss(obs, actions, blocks, stop_gradient, std::move(noise), std::move(time));
}

torch::Tensor Pi0Impl::token_logits(const torch::Tensor& h) {
  const auto& table = paligemma_with_expert->language_model->embed_tokens->weight;  // [V,Wp], tied (openpi's decode)
  // In the table's dtype (float32 masters: float32 logits; an all-bf16 model: bf16 products, not a float32 copy of
  // the table), then float32 for the softmax or argmax.
  return nn::upcast(torch::matmul(h.to(table.scalar_type()), table.t()));
}

Pi0Impl::KiLoss Pi0Impl::compute_prefix_loss(const Observation& obs, const torch::Tensor& actions,
                                             const PrefixBlocks& blocks, bool stop_gradient,
                                             std::optional<torch::Tensor> noise, std::optional<torch::Tensor> time) {
  PI0_CHECK(options_.pi05, "knowledge insulation and subtask prediction train pi0.5 (adaRMS expert, no state token)");
  PI0_CHECK(actions.dim() == 3 && actions.size(1) == options_.action_horizon &&
                actions.size(2) == options_.action_dim,
            "actions must be [B,", options_.action_horizon, ",", options_.action_dim, "], got ", actions.sizes());
  const int64_t b = actions.size(0);
  const bool has_t = blocks.subtask_tokens.defined(), has_f = blocks.fast_tokens.defined();
  if (has_f) {
    PI0_CHECK(blocks.fast_tokens.dim() == 2 && blocks.fast_tokens.size(0) == b && blocks.fast_mask.defined() &&
                  blocks.fast_mask.sizes() == blocks.fast_tokens.sizes(),
              "fast_tokens and fast_mask must both be [B,F] with B = ", b, ", got ", blocks.fast_tokens.sizes(),
              " and ", blocks.fast_mask.defined() ? blocks.fast_mask.sizes() : torch::IntArrayRef{});
  }
  if (has_t) {
    const auto& st = blocks.subtask_tokens;
    PI0_CHECK(st.dim() == 2 && st.size(0) == b && blocks.subtask_mask.defined() &&
                  blocks.subtask_mask.sizes() == st.sizes() && blocks.subtask_targets.defined() &&
                  blocks.subtask_targets.sizes() == st.sizes(),
              "subtask_tokens, subtask_mask and subtask_targets must all be [B,T] with B = ", b, ", got tokens ",
              st.sizes());
  }
  const auto [t, x_t, u_t] = flow_targets(actions, noise, time, options_.action_horizon);
  auto& pwe = *paligemma_with_expert;

  // Pass 1: the backbone over P ∪ T ∪ F. T and F are causal blocks after P (ar = 1 on each row), so no P row sees
  // them and no T row sees F: the P ∪ T keys/values are those of a pass without F.
  auto prefix = embed_prefix(obs);
  const int64_t tp = prefix.embs.size(1);
  const auto dev = prefix.embs.device();
  const auto to_dev = [&](const torch::Tensor& x, torch::ScalarType dtype) {
    return x.defined() ? x.to(dev, dtype) : torch::Tensor();
  };
  const auto t_tokens = to_dev(blocks.subtask_tokens, torch::kLong), t_mask = to_dev(blocks.subtask_mask, torch::kBool),
             t_targets = to_dev(blocks.subtask_targets, torch::kBool);
  const auto f_tokens = to_dev(blocks.fast_tokens, torch::kLong), f_mask = to_dev(blocks.fast_mask, torch::kBool);
  const int64_t tt = has_t ? t_tokens.size(1) : 0, f = has_f ? f_tokens.size(1) : 0;
  auto embs = prefix.embs, pad = prefix.pad_mask, ar = prefix.ar_mask;
  const auto append = [&](const torch::Tensor& tokens, const torch::Tensor& mask, int64_t n) {
    if (n == 0) return;
    embs = torch::cat({embs, pwe.language_model->embed(tokens).to(compute_dtype_)}, 1);
    pad = torch::cat({pad, mask}, 1);
    ar = torch::cat({ar, torch::ones({n}, ar.options())}, 0);
  };
  append(t_tokens, t_mask, tt);
  append(f_tokens, f_mask, f);
  KVCache cache;
  const auto backbone = pwe.forward(embs, torch::Tensor(), attention_mask_for(nn::make_attn_mask(pad, ar), embs),
                                    nn::positions_from_mask(pad), torch::Tensor(), nullptr, &cache,
                                    checkpointed_.language);
  // Pass 2: the expert reads P ∪ T's keys/values only — a stop-gradient copy under insulation, so the flow-matching
  // loss cannot reach the backbone — with the mask and positions of sampling.
  const int64_t seen = tp + tt;
  KVCache p_cache;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    auto k = cache.k[l].narrow(1, 0, seen), v = cache.v[l].narrow(1, 0, seen);
    p_cache.k.push_back(stop_gradient ? k.detach() : k);
    p_cache.v.push_back(stop_gradient ? v.detach() : v);
  }
  cache = KVCache{};
  const auto v_t = velocity_cached(p_cache, pad.narrow(1, 0, seen), obs.state, x_t, t, checkpointed_.language);
  KiLoss out;
  out.flow = (v_t - u_t).pow(2);

  // Cross-entropies: each target is predicted by the nearest valid row before it — F_0 by T's EOS or, T empty, by
  // P's last valid row (the prompt is right-padded before the blocks), a block's later tokens by the one before.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  const auto idx = torch::TensorOptions().dtype(torch::kLong).device(dev);
  const int64_t total = pad.size(1);
  const auto valid_at = torch::where(pad, torch::arange(total, idx).unsqueeze(0).expand({b, total}),
                                     torch::full({1}, -1, idx));
  const auto prev_valid = torch::cat({torch::full({b, 1}, -1, idx), std::get<0>(valid_at.cummax(1)).narrow(1, 0, total - 1)}, 1);
  struct BlockCe {
    torch::Tensor ce, targets, correct, predicted;
  };
  const auto block_ce = [&](const torch::Tensor& tokens, const torch::Tensor& targets, int64_t offset) {
    BlockCe r{torch::zeros({b}, f32), targets.sum(1).to(torch::kFloat32), torch::zeros({b}, f32),
              torch::full({b, tokens.size(1)}, -1, idx)};
    if (tokens.size(1) == 0) return r;
    const auto where = targets.nonzero();  // [N,2] (example, index in the block), the valid targets
    const auto ex = where.select(1, 0), col = where.select(1, 1);
    const int64_t n = where.size(0);
    if (n == 0) return r;
    const auto rows = prev_valid.index({ex, col + offset});
    PI0_CHECK(rows.min().item<int64_t>() >= 0, "a text target has no valid row before it");
    const auto h = backbone.prefix.index({ex, rows});  // [N,Wp]
    const auto target = tokens.index({ex, col});       // [N]
    std::vector<torch::Tensor> nll, argmax;
    for (int64_t s = 0; s < n; s += ki_logit_chunk_) {
      const int64_t m = std::min(ki_logit_chunk_, n - s);
      const auto logits = token_logits(h.narrow(0, s, m));  // [m,V] float32
      const auto tgt = target.narrow(0, s, m);
      nll.push_back(torch::logsumexp(logits, -1) - logits.gather(1, tgt.unsqueeze(1)).squeeze(1));
      argmax.push_back(logits.detach().argmax(-1));
    }
    const auto per_target = nll.size() == 1 ? nll[0] : torch::cat(nll);
    const auto predicted = argmax.size() == 1 ? argmax[0] : torch::cat(argmax);
    r.ce = r.ce.index_add(0, ex, per_target) / r.targets.clamp_min(1.0);
    r.correct = r.correct.index_add(0, ex, (predicted == target).to(torch::kFloat32));
    r.predicted.index_put_({ex, col}, predicted);
    return r;
  };
  if (has_t) {
    auto sub = block_ce(t_tokens, t_targets, tp);
    out.subtask_ce = sub.ce, out.subtask_targets = sub.targets, out.subtask_correct = sub.correct;
  }
  if (has_f) {
    auto fast = block_ce(f_tokens, f_mask, tp + tt);
    out.ce = fast.ce, out.targets = fast.targets, out.correct = fast.correct, out.predicted = fast.predicted;
  } else {
    out.ce = torch::zeros({b}, f32), out.targets = torch::zeros({b}, f32), out.correct = torch::zeros({b}, f32);
    out.predicted = torch::zeros({b, 0}, idx);
  }
  return out;
}

torch::Tensor Pi0Impl::extend_prefix(Prefilled& p, const torch::Tensor& tokens, const torch::Tensor& mask) {
  auto& pwe = *paligemma_with_expert;
  const auto dev = p.pad_mask.device();
  const auto tok = tokens.to(dev, torch::kLong);
  const auto m = mask.to(dev, torch::kBool);
  const auto embs = pwe.language_model->embed(tok).to(compute_dtype_);
  const auto ar = torch::ones({tok.size(1)}, torch::TensorOptions().dtype(torch::kBool).device(dev));
  KVCache added;
  const auto out = pwe.forward(embs, torch::Tensor(),
                               attention_mask_for(nn::make_cached_attn_mask(p.pad_mask, m, ar), embs),
                               nn::positions_after(p.pad_mask, m), torch::Tensor(), &p.cache, &added, 0);
  for (size_t l = 0; l < added.k.size(); ++l) {
    p.cache.k[l] = torch::cat({p.cache.k[l], added.k[l]}, 1);
    p.cache.v[l] = torch::cat({p.cache.v[l], added.v[l]}, 1);
  }
  p.pad_mask = torch::cat({p.pad_mask, m}, 1);
  return out.prefix;
}

Pi0Impl::SubtaskDecoded Pi0Impl::decode_subtask_after(Prefilled& p, const std::vector<int64_t>& cue,
                                                      int64_t max_tokens, int64_t end_id) {
  PI0_CHECK(!cue.empty(), "subtask decoding starts after the cue: give at least one cue token");
  const int64_t c = static_cast<int64_t>(cue.size());
  PI0_CHECK(max_tokens > c, "max_tokens (", max_tokens, ") must leave room after the cue's ", c, " tokens");
  const int64_t b = p.pad_mask.size(0);
  const auto dev = p.pad_mask.device();
  const auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(dev);
  const auto cue_ids = torch::tensor(cue, torch::kLong).to(dev).unsqueeze(0).expand({b, c}).contiguous();
  std::vector<torch::Tensor> tokens = {cue_ids}, masks = {torch::ones({b, c}, bool_opts)};
  auto h_last = extend_prefix(p, cue_ids, masks[0]).select(1, c - 1);
  auto done = torch::zeros({b}, bool_opts);
  for (int64_t n = c; n < max_tokens; ++n) {
    const auto valid = done.logical_not();
    // Greedy, as OpenTau's infer_response; an example that has ended gets padding, which no later row sees.
    const auto next = torch::where(valid, token_logits(h_last).argmax(-1), torch::zeros({1}, cue_ids.options()));
    // Every generated token, the end included, joins the cache: the expert reads the whole block, as in training.
    h_last = extend_prefix(p, next.unsqueeze(1), valid.unsqueeze(1)).select(1, 0);
    tokens.push_back(next.unsqueeze(1));
    masks.push_back(valid.unsqueeze(1));
    done = done.logical_or(valid.logical_and(next == end_id));
    if (done.all().item<bool>()) break;
  }
  return {torch::cat(tokens, 1), torch::cat(masks, 1)};
}

Pi0Impl::SubtaskDecoded Pi0Impl::decode_subtask(const Observation& obs, const std::vector<int64_t>& cue,
                                                int64_t max_tokens, int64_t end_id) {
  PI0_CHECK(options_.pi05, "subtask prediction is pi0.5's");
  torch::NoGradGuard no_grad;
  auto p = prefill(obs, nullptr);
  return decode_subtask_after(p, cue, max_tokens, end_id);
}

torch::Tensor Pi0Impl::sample_actions_after_subtask(const Observation& obs, const std::vector<int64_t>& cue,
                                                    int64_t max_tokens, int64_t end_id, SubtaskDecoded* decoded,
                                                    std::optional<torch::Tensor> noise, int64_t num_steps) {
  PI0_CHECK(options_.pi05, "subtask prediction is pi0.5's");
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  torch::NoGradGuard no_grad;
  const auto acc = compute_dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto f32 = torch::TensorOptions().dtype(acc).device(obs.state.device());
  auto x = noise ? noise->to(f32) : torch::randn({obs.batch_size(), options_.action_horizon, options_.action_dim}, f32);
  auto p = prefill(obs, nullptr);
  auto block = decode_subtask_after(p, cue, max_tokens, end_id);
  if (decoded) *decoded = block;
  return denoise(p.cache, p.pad_mask, obs.state, x, num_steps, nullptr);
}

torch::Tensor Pi0Impl::sample_actions_with_subtask(const Observation& obs, const torch::Tensor& subtask_tokens,
                                                   const torch::Tensor& subtask_mask, std::optional<torch::Tensor> noise,
                                                   int64_t num_steps) {
  PI0_CHECK(options_.pi05, "subtask prediction is pi0.5's");
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  torch::NoGradGuard no_grad;
  const auto acc = compute_dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto f32 = torch::TensorOptions().dtype(acc).device(obs.state.device());
  auto x = noise ? noise->to(f32) : torch::randn({obs.batch_size(), options_.action_horizon, options_.action_dim}, f32);
  auto p = prefill(obs, nullptr);
  if (subtask_tokens.size(1) > 0) extend_prefix(p, subtask_tokens, subtask_mask);
  return denoise(p.cache, p.pad_mask, obs.state, x, num_steps, nullptr);
}

double SampleTiming::total_ms() const {
  double t = prefix_ms;
  for (double s : step_ms) t += s;
  return t;
}

namespace {
// Milliseconds since `since`, after waiting for queued CUDA work on `device` (kernels run asynchronously).
double elapsed_ms(std::chrono::steady_clock::time_point since, const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}
}  // namespace

bool Pi0Impl::uses_sdpa(const torch::Device& device) const {
  switch (attention_impl_) {
    case AttentionImpl::kSdpa: return true;
    case AttentionImpl::kExplicit: return false;
    case AttentionImpl::kAuto: return sdpa_available() && device.is_cuda();
  }
  return false;
}

torch::Tensor Pi0Impl::attention_mask_for(const torch::Tensor& mask, const torch::Tensor& like) const {
  return uses_sdpa(like.device()) ? attention_bias(mask, like.scalar_type()) : mask;
}

// Captured sampling calls, one per input signature: the prefix pass and the denoising loop, each a graph reading and
// writing fixed buffers (the prefix graph's KV cache is the denoising graph's input). Each call copies its
// observation and noise in, replays both and copies the result out.
struct Pi0Impl::GraphCache {
#if PI0_HAVE_CUDA_GRAPH
  struct Entry {
    at::cuda::CUDAGraph prefix_graph, denoise_graph;
    Observation obs;  // the inputs
    torch::Tensor x_in, x_out;
    torch::Tensor prefix, mask;  // real-time chunking's trained mode: the committed rows and their mask
    KVCache cache;               // the prefix graph's outputs
    torch::Tensor pad_mask;
  };
  // batch, cameras, image side, prompt tokens, steps, compute dtype, device index, attention path, trained
  // real-time chunking, simplified weights
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, bool, bool>;
  std::map<Key, std::unique_ptr<Entry>> entries;
#endif
};

Pi0Impl::~Pi0Impl() = default;

torch::Tensor Pi0Impl::velocity_cached(const KVCache& cache, const torch::Tensor& prefix_pad_mask,
                                       const torch::Tensor& state, const torch::Tensor& x, const torch::Tensor& time,
                                       int64_t checkpointed_layers) {
  const int64_t h = options_.action_horizon;
  auto suffix = embed_suffix(state, x, time);
  const int64_t ts = suffix.embs.size(1);
  const auto mask = nn::make_cached_attn_mask(prefix_pad_mask, suffix.pad_mask, suffix.ar_mask);
  auto out = paligemma_with_expert->forward(torch::Tensor(), suffix.embs, attention_mask_for(mask, suffix.embs),
                                            nn::positions_after(prefix_pad_mask, suffix.pad_mask), suffix.cond,
                                            &cache, nullptr, checkpointed_layers);
  return action_out_proj->forward(nn::upcast(out.suffix.narrow(1, ts - h, h)));
}

Pi0Impl::Prefilled Pi0Impl::prefill(const Observation& obs, FusedWeights* fused) {
  auto prefix = embed_prefix(obs);
  Prefilled out;
  out.pad_mask = prefix.pad_mask;
  if (fused) {
    out.cache = fused_prefix_cache(*this, *fused, prefix);
  } else {
    paligemma_with_expert->forward(prefix.embs, torch::Tensor(),
                                   attention_mask_for(nn::make_attn_mask(prefix.pad_mask, prefix.ar_mask), prefix.embs),
                                   nn::positions_from_mask(prefix.pad_mask), torch::Tensor(), nullptr, &out.cache, 0);
  }
  return out;
}

torch::Tensor Pi0Impl::denoise(const KVCache& cache, const torch::Tensor& prefix_pad_mask, const torch::Tensor& state,
                               torch::Tensor x, int64_t num_steps, FusedWeights* fused,
                               const std::function<void()>& after_step, const torch::Tensor& trained_prefix,
                               const torch::Tensor& trained_mask, const RtcRequest* guided) {
  const int64_t b = x.size(0);
  auto f32 = torch::TensorOptions().dtype(x.scalar_type()).device(x.device());
  SuffixContext ctx;
  if (fused) ctx = suffix_context(*this, *fused, cache, prefix_pad_mask, state, b, x.device());
  const VelocityField velocity = [&](const torch::Tensor& x_t, const torch::Tensor& time) {
    if (fused) return fused_velocity(*this, *fused, cache, ctx, x_t, time_branch(*this, *fused, time));
    return velocity_cached(cache, prefix_pad_mask, state, x_t, time);
  };
  if (guided) return rtc_sample(velocity, x, num_steps, *guided, after_step);
  if (trained_prefix.defined()) return rtc_sample_trained(velocity, x, num_steps, trained_prefix, trained_mask, after_step);
  const auto* branches = fused ? &schedule_branches(*this, *fused, num_steps, b, x.device()) : nullptr;
  // Time advances in float32 like the reference's `t + dt` loop.
  const float dt = -1.0f / static_cast<float>(num_steps);
  float t = 1.0f;
  for (int64_t step = 0; step < num_steps; ++step) {
    const auto v = branches ? fused_velocity(*this, *fused, cache, ctx, x, (*branches)[static_cast<size_t>(step)])
                            : velocity(x, torch::full({b}, t, f32));
    x = x + dt * v;
    t += dt;
    if (after_step) after_step();
  }
  return x;
}

FusedWeights* Pi0Impl::fused_for_sampling(bool use_kv_cache) {
  // Graphs read the simplified weights and the modules' cast copies by address: both go when any weight changes.
  auto signature = weights_signature(*this);
  if (signature != sampled_weights_) {
    fused_.reset();
    graphs_.reset();
    sampled_weights_ = std::move(signature);
  }
  if (!use_kv_cache || !fused_inference_ || paligemma_with_expert->layer_gate) return nullptr;
  if (!fused_ || fused_->dtype != compute_dtype_ || fused_->fp8_simulated != fp8_simulation_) {
    graphs_.reset();
    fused_ = std::make_unique<FusedWeights>(fuse_weights(*this, compute_dtype_));
  }
  return fused_.get();
}

torch::Tensor Pi0Impl::sample_actions(const Observation& obs, std::optional<torch::Tensor> noise, int64_t num_steps,
                                      bool use_kv_cache, SampleTiming* timing, const RtcRequest* rtc) {
  PI0_CHECK(!options_.fast, "pi0-FAST samples tokens (sample_fast_tokens), not flow-matching actions");
  PI0_CHECK(num_steps > 0, "num_steps must be positive");
  if (rtc && !rtc->active()) rtc = nullptr;
  if (rtc) {
    PI0_CHECK(use_kv_cache, "real-time chunking samples with the prefix KV cache");
    check_rtc_request(*rtc, options_.action_horizon, options_.action_dim, "sample_actions");
    PI0_CHECK(rtc->prev.size(0) == obs.batch_size(), "prev_action_chunk has batch ", rtc->prev.size(0),
              ", the observation ", obs.batch_size());
  }
  torch::NoGradGuard no_grad;
  const int64_t b = obs.batch_size(), h = options_.action_horizon;
  const auto acc = compute_dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto f32 = torch::TensorOptions().dtype(acc).device(obs.state.device());
  auto x = noise ? noise->to(f32) : torch::randn({b, h, options_.action_dim}, f32);
  const auto device = obs.state.device();
  FusedWeights* fused = fused_for_sampling(use_kv_cache);
  if (timing) {
    *timing = SampleTiming{};
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  }
  auto clock = std::chrono::steady_clock::now();
  const auto lap = [&] {
    const double ms = elapsed_ms(clock, device);
    clock = std::chrono::steady_clock::now();
    return ms;
  };
  // The profiler's ranges (common/profiler.h): the prefix pass, then the denoising steps.
  ProfileScope prefix_range(phase::kPrefix);
  if (!use_kv_cache) {
    auto prefix = embed_prefix(obs);
    if (timing) timing->prefix_ms = lap();
    prefix_range.end();
    ProfileScope denoise_range(phase::kDenoise);
    const float dt = -1.0f / static_cast<float>(num_steps);
    float t = 1.0f;
    for (int64_t step = 0; step < num_steps; ++step) {
      x = x + dt * velocity_full(prefix, obs.state, x, torch::full({b}, t, f32));
      t += dt;
      if (timing) timing->step_ms.push_back(lap());
    }
    return x;
  }
  torch::Tensor trained_prefix, trained_mask;
  if (rtc && rtc->mode == RtcMode::kTrained) std::tie(trained_prefix, trained_mask) = rtc_trained_prefix(*rtc, h, f32);
  const bool guided = rtc && rtc->mode == RtcMode::kGuided;  // eager: the exact product's backward is not captured
#if PI0_HAVE_CUDA_GRAPH
  if (cuda_graph_ && device.is_cuda() && !guided) {
    if (!graphs_) graphs_ = std::make_unique<GraphCache>();
    const bool trained = trained_prefix.defined();
    const GraphCache::Key key{b, static_cast<int64_t>(obs.images.size()), obs.images.at(0).size(-1),
                              obs.tokenized_prompt.size(1), num_steps, static_cast<int>(compute_dtype_),
                              device.index(), uses_sdpa(device), trained, fused != nullptr};
    auto& slot = graphs_->entries[key];
    const bool fresh = !slot;
    if (fresh) {  // the graphs' fixed input buffers
      slot = std::make_unique<GraphCache::Entry>();
      for (const auto& t : obs.images) slot->obs.images.push_back(torch::empty_like(t));
      for (const auto& t : obs.image_masks) slot->obs.image_masks.push_back(torch::empty_like(t));
      slot->obs.state = torch::empty_like(obs.state);
      slot->obs.tokenized_prompt = torch::empty_like(obs.tokenized_prompt);
      slot->obs.tokenized_prompt_mask = torch::empty_like(obs.tokenized_prompt_mask);
      slot->x_in = torch::empty_like(x);
      if (trained) slot->prefix = torch::empty_like(trained_prefix), slot->mask = torch::empty_like(trained_mask);
    }
    for (size_t c = 0; c < obs.images.size(); ++c) {
      slot->obs.images[c].copy_(obs.images[c]);
      slot->obs.image_masks[c].copy_(obs.image_masks[c]);
    }
    slot->obs.state.copy_(obs.state);
    slot->obs.tokenized_prompt.copy_(obs.tokenized_prompt);
    slot->obs.tokenized_prompt_mask.copy_(obs.tokenized_prompt_mask);
    slot->x_in.copy_(x);
    if (trained) slot->prefix.copy_(trained_prefix), slot->mask.copy_(trained_mask);
    if (fresh) {
      auto& e = *slot;
      const auto run_prefix = [&] {
        auto p = prefill(e.obs, fused);
        e.cache = std::move(p.cache);
        e.pad_mask = p.pad_mask;
      };
      const auto run_denoise = [&] {
        return denoise(e.cache, e.pad_mask, e.obs.state.to(acc), e.x_in, num_steps, fused, {}, e.prefix, e.mask);
      };
      // Capture on a side stream after one eager run there (lazy initialization — cuBLAS handles and workspaces,
      // the Dense cast caches, the schedule's time branches — must not happen inside a capture).
      auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
      stream.synchronize();
      c10::cuda::CUDAStreamGuard guard(stream);
      torch::cuda::synchronize(device.index());
      run_prefix();
      run_denoise();
      stream.synchronize();
      e.prefix_graph.capture_begin();
      run_prefix();
      e.prefix_graph.capture_end();
      e.denoise_graph.capture_begin();
      e.x_out = run_denoise();
      e.denoise_graph.capture_end();
      stream.synchronize();
    }
    slot->prefix_graph.replay();
    if (timing) timing->prefix_ms = lap();
    prefix_range.end();
    ProfileScope denoise_range(phase::kDenoise);
    slot->denoise_graph.replay();
    x = slot->x_out.clone();
    if (timing) {
      const double total = lap();
      for (int64_t step = 0; step < num_steps; ++step) timing->step_ms.push_back(total / num_steps);
    }
    return x;
  }
#endif
  auto pre = prefill(obs, fused);
  if (timing) timing->prefix_ms = lap();
  prefix_range.end();
  ProfileScope denoise_range(phase::kDenoise);
  const auto state = obs.state.to(f32);
  std::function<void()> after_step;
  if (timing) after_step = [&] { timing->step_ms.push_back(lap()); };
  if (guided) {
    RtcRequest on_device = *rtc;
    on_device.prev = rtc->prev.to(f32);
    return denoise(pre.cache, pre.pad_mask, state, x, num_steps, fused, after_step, {}, {}, &on_device);
  }
  return denoise(pre.cache, pre.pad_mask, state, x, num_steps, fused, after_step, trained_prefix, trained_mask);
}

}  // namespace pi0::model
