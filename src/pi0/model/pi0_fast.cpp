#include "pi0/model/pi0_fast.h"

#include <cmath>

#include "pi0/common/check.h"
#include "pi0/model/pi0.h"  // joint_attention
#include "pi0/nn/attention_mask.h"
#include "pi0/nn/checkpoint.h"
#include "pi0/nn/rope.h"

namespace pi0::model {

namespace {
std::shared_ptr<torch::nn::Module> holder(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}
}  // namespace

Pi0FastImpl::Pi0FastImpl(Pi0FastOptions o) : options_(std::move(o)) {
  auto& p = options_.paligemma;
  if (p.vocab_size <= 0) throw UserError("pi0-FAST's language model needs a token embedding (vocab_size > 0)");
  p.cond_dim = 0;
  build(Siglip(options_.siglip), nn::Dense(nn::DenseOptions(options_.siglip.width, p.width).init("zeros")),
        GemmaModel(p));
}

Pi0FastImpl::Pi0FastImpl(Pi0FastOptions o, Siglip vision_tower, nn::Dense projector_linear, GemmaModel lm)
    : options_(std::move(o)) {
  if (options_.paligemma.vocab_size <= 0)
    throw UserError("pi0-FAST's language model needs a token embedding (vocab_size > 0)");
  options_.paligemma.cond_dim = 0;
  build(std::move(vision_tower), std::move(projector_linear), std::move(lm));
}

void Pi0FastImpl::build(Siglip vision_tower, nn::Dense projector_linear, GemmaModel lm) {
  auto pg_model = holder(*holder(*this, "paligemma"), "model");
  vision = holder(*pg_model, "vision_tower")->register_module("vision_model", std::move(vision_tower));
  projector = holder(*pg_model, "multi_modal_projector")->register_module("linear", std::move(projector_linear));
  language_model = pg_model->register_module("language_model", std::move(lm));
}

Pi0FastImpl::Embedded Pi0FastImpl::embed_inputs(const Observation& obs, const torch::Tensor& token_ar_mask) {
  const int64_t n_cam = static_cast<int64_t>(obs.images.size());
  PI0_CHECK(n_cam > 0 && obs.image_masks.size() == obs.images.size(), "one image mask per camera expected");
  const int64_t b = obs.images[0].size(0);
  // SigLIP checkpoints its own layers; only a pass that builds a graph recomputes anything.
  const auto img = projector->forward(vision->forward(torch::cat(obs.images, 0), compute_dtype_,
                                                      torch::GradMode::is_enabled() ? ckpt_vision_ : 0));
  const int64_t p = img.size(1);
  std::vector<torch::Tensor> embs, pads, ars;
  for (int64_t c = 0; c < n_cam; ++c) {
    embs.push_back(img.narrow(0, c * b, b));
    pads.push_back(obs.image_masks[c].to(torch::kBool).view({b, 1}).expand({b, p}));
    ars.push_back(torch::zeros({b, p}, pads.back().options()));
  }
  embs.push_back(language_model->embed(obs.tokenized_prompt.to(torch::kLong)).to(compute_dtype_));
  pads.push_back(obs.tokenized_prompt_mask.to(torch::kBool));
  ars.push_back(token_ar_mask.to(torch::kBool));
  return {torch::cat(embs, 1), torch::cat(pads, 1), torch::cat(ars, 1)};
}

torch::Tensor Pi0FastImpl::transformer(torch::Tensor x, const torch::Tensor& mask, const torch::Tensor& positions,
                                       std::vector<torch::Tensor>* k_cache, std::vector<torch::Tensor>* v_cache,
                                       int64_t write_at) {
  const auto& o = language_model->options;
  const int64_t b = x.size(0), t = x.size(1), n = o.num_heads, kv = o.num_kv_heads, d = o.head_dim;
  const auto rope = nn::rope_tables(positions, d, torch::kFloat32);
  for (int64_t l = 0; l < o.depth; ++l) {
    auto& layer = language_model->layers[static_cast<size_t>(l)];
    // By value: under checkpointing the recomputation runs in backward, after this function has returned.
    auto run_layer = [layer, rope, mask, b, t, n, kv, d, k_cache, v_cache, l, write_at](const torch::Tensor& x_in) mutable {
      const auto h = layer->input_layernorm->forward(x_in).first;
      // openpi scales q after RoPE.
      auto q = nn::apply_rope(layer->self_attn->q_proj->forward(h).view({b, t, n, d}), rope) *
               (1.0 / std::sqrt(static_cast<double>(d)));
      auto k = nn::apply_rope(layer->self_attn->k_proj->forward(h).view({b, t, kv, d}), rope);
      auto v = layer->self_attn->v_proj->forward(h).view({b, t, kv, d});
      if (k_cache) {
        auto& kc = (*k_cache)[static_cast<size_t>(l)];
        auto& vc = (*v_cache)[static_cast<size_t>(l)];
        kc.narrow(1, write_at, t).copy_(k);
        vc.narrow(1, write_at, t).copy_(v);
        k = kc, v = vc;
      }
      auto y = x_in + layer->self_attn->o_proj->forward(joint_attention(q, k, v, mask));
      return y + layer->mlp->forward(layer->post_attention_layernorm->forward(y).first);
    };
    // Training only (no cache): the layer's activations are recomputed in backward instead of kept.
    if (!k_cache && l < ckpt_language_ && torch::GradMode::is_enabled()) {
      x = nn::checkpoint([run_layer](const nn::TensorList& in) mutable { return nn::TensorList{run_layer(in[0])}; },
                         {x}, *layer)[0];
    } else {
      x = run_layer(x);
    }
  }
  return language_model->norm->forward(x).first;
}

torch::Tensor Pi0FastImpl::logits(const torch::Tensor& pre_logits) const {
  return torch::matmul(pre_logits.to(torch::kFloat32), language_model->embed_tokens->weight.to(torch::kFloat32).t());
}

Pi0FastImpl::Loss Pi0FastImpl::compute_loss(const Observation& obs, const torch::Tensor& token_ar_mask,
                                            const torch::Tensor& token_loss_mask, bool keep_logits) {
  const auto e = embed_inputs(obs, token_ar_mask);
  const int64_t b = e.embs.size(0), t = e.embs.size(1), l = obs.tokenized_prompt.size(1);
  PI0_CHECK(l >= 2, "pi0-FAST needs at least two text tokens, got ", l);
  // The last input predicts nothing: the pass runs over T - 1 tokens; positions arange (openpi's quirk, see header).
  const auto mask = nn::make_attn_mask(e.pad_mask, e.ar_mask).narrow(1, 0, t - 1).narrow(2, 0, t - 1);
  const auto positions =
      torch::arange(t - 1, torch::TensorOptions().dtype(torch::kLong).device(e.embs.device())).unsqueeze(0).expand({b, t - 1});
  const auto pre = transformer(e.embs.narrow(1, 0, t - 1), mask, positions, nullptr, nullptr, 0).narrow(1, t - l, l - 1);
  // Logits only where a loss-masked target is: [n, W] rows in (b, j) order, chunked to bound the [rows, V] memory.
  const auto target_mask = token_loss_mask.to(torch::kBool).narrow(1, 1, l - 1);  // [B, L-1]
  const auto rows = pre.reshape({-1, pre.size(2)}).index({target_mask.reshape({-1})});
  const auto targets = obs.tokenized_prompt.to(torch::kLong).narrow(1, 1, l - 1).reshape({-1}).index({target_mask.reshape({-1})});
  std::vector<torch::Tensor> logp_parts, argmax_parts, logit_parts;
  for (int64_t r0 = 0; r0 < rows.size(0); r0 += logit_chunk_) {
    const int64_t nr = std::min(logit_chunk_, rows.size(0) - r0);
    const auto lg = logits(rows.narrow(0, r0, nr));
    const auto tg = targets.narrow(0, r0, nr);
    logp_parts.push_back(torch::log_softmax(lg, -1).gather(1, tg.unsqueeze(1)).squeeze(1));
    argmax_parts.push_back(lg.detach().argmax(-1));
    if (keep_logits) logit_parts.push_back(lg.detach());
  }
  const auto fopts = torch::TensorOptions().dtype(torch::kFloat32).device(pre.device());
  auto per_token = torch::zeros({b * (l - 1)}, fopts);
  auto predicted = torch::full({b * (l - 1)}, -1, fopts.dtype(torch::kLong));
  if (!logp_parts.empty()) {
    per_token = per_token.masked_scatter(target_mask.reshape({-1}), torch::cat(logp_parts));
    predicted = predicted.masked_scatter(target_mask.reshape({-1}), torch::cat(argmax_parts));
  }
  Loss out;
  out.targets = target_mask.to(torch::kFloat32).sum(1);
  out.loss = -per_token.view({b, l - 1}).sum(1) / out.targets.clamp_min(1.0);
  out.predicted = predicted.view({b, l - 1});
  const auto next = obs.tokenized_prompt.to(torch::kLong).narrow(1, 1, l - 1);
  out.correct = (out.predicted == next).logical_and(target_mask).to(torch::kFloat32).sum(1);
  if (keep_logits)
    out.logits = logit_parts.empty() ? torch::zeros({0, language_model->options.vocab_size}, fopts) : torch::cat(logit_parts);
  return out;
}

Pi0FastImpl::Decoded Pi0FastImpl::sample_tokens(const Observation& obs, const torch::Tensor& token_ar_mask,
                                                int64_t max_decoding_steps, double temperature,
                                                std::optional<at::Generator> generator, bool keep_logits) {
  PI0_CHECK(max_decoding_steps > 0, "max_decoding_steps must be > 0, got ", max_decoding_steps);
  PI0_CHECK(temperature >= 0.0, "temperature must be >= 0, got ", temperature);
  torch::NoGradGuard no_grad;
  const auto e = embed_inputs(obs, token_ar_mask);
  const int64_t b = e.embs.size(0), n = e.embs.size(1), s_total = n + max_decoding_steps;
  const auto dev = e.embs.device();
  // left_to_right_align: the mask is made in the original order, then rows and columns are rolled with the tokens.
  auto attn = nn::make_attn_mask(e.pad_mask, e.ar_mask);
  const auto idx = torch::arange(n, torch::TensorOptions().dtype(torch::kLong).device(dev));
  const auto seqlen = (e.pad_mask.to(torch::kLong) * idx).amax(1) + 1;  // [B]: one past the last valid token
  std::vector<torch::Tensor> xs, pads, masks;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t shift = -seqlen[i].item<int64_t>();
    xs.push_back(torch::roll(e.embs[i], shift, 0));
    pads.push_back(torch::roll(e.pad_mask[i], shift, 0));
    masks.push_back(torch::roll(attn[i], {shift, shift}, {0, 1}));
  }
  const auto x = torch::stack(xs), pad = torch::stack(pads);
  const auto prefill_len = pad.to(torch::kLong).sum(1);  // [B]
  const auto prefix_start = n - prefill_len;              // [B]
  const auto prefill_mask =
      torch::cat({torch::stack(masks), torch::zeros({b, n, max_decoding_steps}, pad.options())}, 2);  // [B,N,S]
  const auto positions = pad.to(torch::kLong).cumsum(1) - 1;
  const auto& o = language_model->options;
  const auto cache_opts = torch::TensorOptions().dtype(x.scalar_type()).device(dev);
  std::vector<torch::Tensor> kc, vc;
  for (int64_t l = 0; l < o.depth; ++l) {
    kc.push_back(torch::zeros({b, s_total, o.num_kv_heads, o.head_dim}, cache_opts));
    vc.push_back(torch::zeros({b, s_total, o.num_kv_heads, o.head_dim}, cache_opts));
  }
  auto last = logits(transformer(x, prefill_mask, positions, &kc, &vc, 0).narrow(1, n - 1, 1)).squeeze(1);  // [B,V]
  Decoded out;
  out.tokens = torch::zeros({b, max_decoding_steps}, torch::TensorOptions().dtype(torch::kLong).device(dev));
  const auto slots = torch::arange(s_total, torch::TensorOptions().dtype(torch::kLong).device(dev)).view({1, 1, s_total});
  for (int64_t step = 0; step < max_decoding_steps; ++step) {
    if (keep_logits) out.step_logits.push_back(last);
    torch::Tensor token;
    if (temperature > 0.0) {
      const auto probs = torch::softmax(last / temperature, -1);
      token = (generator ? torch::multinomial(probs, 1, false, *generator) : torch::multinomial(probs, 1)).squeeze(1);
    } else {
      token = last.argmax(-1);
    }
    out.tokens.select(1, step).copy_(token);
    out.steps = step + 1;
    // openpi stops only when every row's token is EOS at the same step (rows that ended before keep decoding).
    if ((token == kPaligemmaEos).all().item<bool>() || step + 1 == max_decoding_steps) break;
    const auto mask = (slots >= prefix_start.view({b, 1, 1})) & (slots < n + step + 1);  // [B,1,S]
    const auto pos = (prefill_len + step + 1).view({b, 1});  // one past training's position (openpi #705)
    const auto emb = language_model->embed(token.view({b, 1})).to(x.scalar_type());
    last = logits(transformer(emb, mask, pos, &kc, &vc, n + step)).squeeze(1);
  }
  return out;
}

}  // namespace pi0::model
