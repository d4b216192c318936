#include "pi0/data/transforms.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"

namespace pi0::data {

// ---------------------------------------------------------------------------------------------------------------
// Random numbers

namespace {
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t Rng::next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double Rng::uniform(double lo, double hi) {
  const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * u;
}

uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index) {
  return splitmix(splitmix(splitmix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

// ---------------------------------------------------------------------------------------------------------------
// Actions and normalization

torch::Tensor delta_actions(const torch::Tensor& actions, const torch::Tensor& state, const std::vector<bool>& mask,
                            const std::string& what) {
  const int64_t m = static_cast<int64_t>(mask.size());
  if (m == 0) return actions;
  if (m > actions.size(-1) || m > state.size(-1))
    throw UserError(what + ": delta_action_mask has " + std::to_string(m) + " entries, expected at most " +
                    std::to_string(std::min(actions.size(-1), state.size(-1))) + " (action dim " +
                    std::to_string(actions.size(-1)) + ", state dim " + std::to_string(state.size(-1)) + ")");
  torch::Tensor out = actions.clone();
  for (int64_t d = 0; d < m; ++d)
    if (mask[static_cast<size_t>(d)]) out.select(-1, d).sub_(state.select(-1, d));
  return out;
}

torch::Tensor absolute_actions(const torch::Tensor& actions, const torch::Tensor& state, const std::vector<bool>& mask) {
  torch::Tensor out = actions.clone();
  for (int64_t d = 0; d < static_cast<int64_t>(mask.size()); ++d)
    if (mask[static_cast<size_t>(d)]) out.select(-1, d).add_(state.select(-1, d));
  return out;
}

namespace {
torch::Tensor vec(const std::vector<double>& v, int64_t n) {
  return torch::tensor(std::vector<double>(v.begin(), v.begin() + n), torch::kFloat64).to(torch::kFloat32);
}
}  // namespace

torch::Tensor normalize(const torch::Tensor& x, const KeyStats& stats, NormMode mode, const std::string& what) {
  if (mode == NormMode::kNone) return x;
  const int64_t d = x.size(-1);
  if (static_cast<int64_t>(stats.mean.size()) < d)
    throw UserError(what + " has dim " + std::to_string(stats.mean.size()) + ", expected " + std::to_string(d) +
                    " (the data's dim; recompute the norm stats for this dataset)");
  if (mode == NormMode::kZScore) return (x - vec(stats.mean, d)) / (vec(stats.std, d) + 1e-6);
  if (stats.q01.empty())
    throw UserError(what + " has no q01/q99, expected quantiles for quantile normalization (pi0.5)");
  torch::Tensor q01 = vec(stats.q01, d), q99 = vec(stats.q99, d);
  return (x - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0;
}

torch::Tensor unnormalize(const torch::Tensor& x, const KeyStats& stats, NormMode mode) {
  if (mode == NormMode::kNone) return x;
  const int64_t d = x.size(-1);
  if (mode == NormMode::kZScore) {
    const int64_t n = std::min<int64_t>(d, static_cast<int64_t>(stats.mean.size()));
    torch::Tensor mean = torch::zeros({d}), std = torch::ones({d});
    mean.narrow(0, 0, n).copy_(vec(stats.mean, n));
    std.narrow(0, 0, n).copy_(vec(stats.std, n));
    return x * (std + 1e-6) + mean;
  }
  const int64_t n = std::min<int64_t>(d, static_cast<int64_t>(stats.q01.size()));
  torch::Tensor out = x.clone();
  torch::Tensor q01 = vec(stats.q01, n), q99 = vec(stats.q99, n);
  out.narrow(-1, 0, n).copy_((x.narrow(-1, 0, n) + 1.0) / 2.0 * (q99 - q01 + 1e-6) + q01);
  return out;
}

torch::Tensor pad_last_dim(const torch::Tensor& x, int64_t dim) {
  const int64_t d = x.size(-1);
  if (d >= dim) return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = dim;
  torch::Tensor out = torch::zeros(shape, x.options());
  out.narrow(-1, 0, d).copy_(x);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Images

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

/// Fixed-point taps of a 1-D bilinear (triangle) resampling from `in` to `out` samples, PIL-style.
struct Taps {
  std::vector<int> start, count;
  std::vector<int32_t> weights;  // count.max() per output sample
  int ksize = 0;
};

Taps make_taps(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.start.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.weights.assign(static_cast<size_t>(out * t.ksize), 0);
  std::vector<double> w(static_cast<size_t>(t.ksize));
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    int xmax = std::min(static_cast<int>(center + support + 0.5), static_cast<int>(in)) - xmin;
    xmax = std::min(xmax, t.ksize);
    double total = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double arg = (x + xmin - center + 0.5) / filterscale;
      const double v = std::abs(arg) < 1.0 ? 1.0 - std::abs(arg) : 0.0;
      w[static_cast<size_t>(x)] = v;
      total += v;
    }
    for (int x = 0; x < xmax; ++x) {
      const double k = total != 0.0 ? w[static_cast<size_t>(x)] / total : 0.0;
      t.weights[static_cast<size_t>(o * t.ksize + x)] =
          static_cast<int32_t>(k < 0 ? std::trunc(-0.5 + k * (1 << kPrecisionBits)) : std::trunc(0.5 + k * (1 << kPrecisionBits)));
    }
    t.start[static_cast<size_t>(o)] = xmin;
    t.count[static_cast<size_t>(o)] = xmax;
  }
  return t;
}

inline uint8_t clip8(int64_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(std::clamp<int64_t>(v, 0, 255));
}

}  // namespace

torch::Tensor resize_bilinear(const torch::Tensor& img_in, int64_t out_h, int64_t out_w) {
  torch::Tensor img = img_in.contiguous();
  const int64_t H = img.size(0), W = img.size(1);
  const uint8_t* src = img.data_ptr<uint8_t>();
  // Horizontal pass: [H,W,3] -> [H,out_w,3].
  torch::Tensor mid = img;
  if (out_w != W) {
    mid = torch::empty({H, out_w, 3}, torch::kUInt8);
    Taps t = make_taps(W, out_w);
    uint8_t* dst = mid.data_ptr<uint8_t>();
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t x = 0; x < out_w; ++x) {
        const int32_t* k = &t.weights[static_cast<size_t>(x * t.ksize)];
        const int s0 = t.start[static_cast<size_t>(x)];
        for (int c = 0; c < 3; ++c) {
          int64_t acc = 1 << (kPrecisionBits - 1);
          for (int i = 0; i < t.count[static_cast<size_t>(x)]; ++i)
            acc += static_cast<int64_t>(src[(y * W + s0 + i) * 3 + c]) * k[i];
          dst[(y * out_w + x) * 3 + c] = clip8(acc);
        }
      }
    }
  }
  if (out_h == H) return mid.contiguous();
  // Vertical pass: [H,out_w,3] -> [out_h,out_w,3].
  torch::Tensor out = torch::empty({out_h, out_w, 3}, torch::kUInt8);
  Taps t = make_taps(H, out_h);
  const uint8_t* m = mid.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t row = out_w * 3;
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* k = &t.weights[static_cast<size_t>(y * t.ksize)];
    const int s0 = t.start[static_cast<size_t>(y)];
    const int n = t.count[static_cast<size_t>(y)];
    for (int64_t xc = 0; xc < row; ++xc) {
      int64_t acc = 1 << (kPrecisionBits - 1);
      for (int i = 0; i < n; ++i) acc += static_cast<int64_t>(m[(s0 + i) * row + xc]) * k[i];
      dst[y * row + xc] = clip8(acc);
    }
  }
  return out;
}

torch::Tensor resize_with_pad(const torch::Tensor& img, int64_t size) {
  const int64_t h = img.size(0), w = img.size(1);
  if (h == size && w == size) return img;
  const double ratio = std::max(static_cast<double>(w) / static_cast<double>(size),
                                static_cast<double>(h) / static_cast<double>(size));
  const int64_t rh = static_cast<int64_t>(static_cast<double>(h) / ratio);
  const int64_t rw = static_cast<int64_t>(static_cast<double>(w) / ratio);
  torch::Tensor resized = resize_bilinear(img, rh, rw);
  torch::Tensor out = torch::zeros({size, size, 3}, torch::kUInt8);
  const int64_t top = std::max<int64_t>(0, (size - rh) / 2), left = std::max<int64_t>(0, (size - rw) / 2);
  out.narrow(0, top, rh).narrow(1, left, rw).copy_(resized);
  return out;
}

torch::Tensor image_to_float(const torch::Tensor& hwc) {
  return (hwc.permute({2, 0, 1}).to(torch::kFloat32) / 255.0f * 2.0f - 1.0f).contiguous();
}

namespace {

// HSV helpers on [0,1] values (the usual hexcone model).
inline void rgb_to_hsv(float r, float g, float b, float& h, float& s, float& v) {
  const float mx = std::max({r, g, b}), mn = std::min({r, g, b}), d = mx - mn;
  v = mx;
  s = mx > 0.f ? d / mx : 0.f;
  if (d <= 0.f) {
    h = 0.f;
  } else if (mx == r) {
    h = std::fmod((g - b) / d, 6.f) / 6.f;
  } else if (mx == g) {
    h = ((b - r) / d + 2.f) / 6.f;
  } else {
    h = ((r - g) / d + 4.f) / 6.f;
  }
  if (h < 0.f) h += 1.f;
}

inline void hsv_to_rgb(float h, float s, float v, float& r, float& g, float& b) {
  const float h6 = h * 6.f;
  const int i = static_cast<int>(std::floor(h6)) % 6;
  const float f = h6 - std::floor(h6);
  const float p = v * (1.f - s), q = v * (1.f - s * f), t = v * (1.f - s * (1.f - f));
  switch (i) {
    case 0: r = v; g = t; b = p; break;
    case 1: r = q; g = v; b = p; break;
    case 2: r = p; g = v; b = t; break;
    case 3: r = p; g = q; b = v; break;
    case 4: r = t; g = p; b = v; break;
    default: r = v; g = p; b = q; break;
  }
}

/// Piecewise-linear contrast curve through (0,0), (0.5,0.5), (1,1): slope `slant` = tan((c+1)·π/4) in the middle
/// and 1/slant on the outer parts, which meet at p1 = slant / (2(1+slant)) and 1 − p1.
inline float contrast_curve(float v, float slant) {
  const float p1 = slant / (2.f * (1.f + slant));
  if (v < p1) return v / slant;
  if (v > 1.f - p1) return v / slant + 1.f - 1.f / slant;
  return slant * (v - 0.5f) + 0.5f;
}

}  // namespace

void augment_image(torch::Tensor& chw, bool wrist, Rng& rng, const AugmentOptions& opt) {
  PI0_CHECK(chw.dim() == 3 && chw.size(0) == 3 && chw.is_contiguous(), "augment_image wants contiguous [3,S,S]");
  const int64_t H = chw.size(1), W = chw.size(2);
  torch::Tensor x = (chw + 1.0f) * 0.5f;  // [0,1]
  if (!wrist) {
    // Crop (continuous offset) -> resize back -> rotate, composed into one output->input map, bilinear, black fill.
    const double ch = std::floor(static_cast<double>(H) * opt.crop_scale);
    const double cw = std::floor(static_cast<double>(W) * opt.crop_scale);
    const double off_y = rng.uniform(0.0, static_cast<double>(H) - ch);
    const double off_x = rng.uniform(0.0, static_cast<double>(W) - cw);
    const double angle = rng.uniform(-opt.max_rotation_deg, opt.max_rotation_deg) * M_PI / 180.0;
    const double ca = std::cos(angle), sa = std::sin(angle);
    torch::Tensor out = torch::zeros_like(x);
    const float* src = x.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const double cy = H / 2.0, cx = W / 2.0;
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t xo = 0; xo < W; ++xo) {
        const double u = xo + 0.5 - cx, v = y + 0.5 - cy;
        const double ru = ca * u - sa * v + cx, rv = sa * u + ca * v + cy;  // rotated, output frame
        const double sx = ru * (cw / W) + off_x - 0.5, sy = rv * (ch / H) + off_y - 0.5;  // input pixel coords
        const int64_t x0 = static_cast<int64_t>(std::floor(sx)), y0 = static_cast<int64_t>(std::floor(sy));
        const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
        for (int64_t c = 0; c < 3; ++c) {
          const float* plane = src + c * H * W;
          auto at = [&](int64_t yy, int64_t xx) -> float {
            return (yy < 0 || yy >= H || xx < 0 || xx >= W) ? 0.f : plane[yy * W + xx];
          };
          const float val = (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x0 + 1)) +
                            fy * ((1 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1));
          dst[c * H * W + y * W + xo] = val;
        }
      }
    }
    x = out;
  }
  // Color jitter: all draws happen whether or not it is applied, so the stream does not depend on the coin.
  const double b = rng.uniform(-opt.brightness, opt.brightness);
  const double c = rng.uniform(-opt.contrast, opt.contrast);
  (void)rng.uniform(-0.5, 0.5);  // saturation: drawn, result discarded as in augmax 0.4.1
  const double hue = rng.uniform(-opt.hue, opt.hue);
  const bool apply = rng.uniform(0.0, 1.0) < opt.jitter_prob;
  if (apply) {
    const float slant = static_cast<float>(std::tan((c + 1.0) * M_PI / 4.0));
    float* p = x.data_ptr<float>();
    const int64_t n = H * W;
    for (int64_t i = 0; i < n; ++i) {
      float h, s, v;
      rgb_to_hsv(p[i], p[n + i], p[2 * n + i], h, s, v);
      v = b < 0 ? v * static_cast<float>(1.0 + b) : v * static_cast<float>(1.0 - b) + static_cast<float>(b);
      v = std::clamp(contrast_curve(v, slant), 0.f, 1.f);
      h = h + static_cast<float>(hue);
      h -= std::floor(h);
      hsv_to_rgb(h, s, v, p[i], p[n + i], p[2 * n + i]);
    }
  }
  chw.copy_(x * 2.0f - 1.0f);
}

// ---------------------------------------------------------------------------------------------------------------
// Pipeline

TransformOptions TransformOptions::resolved() const {
  TransformOptions o = *this;
  if (o.model_type != "pi0" && o.model_type != "pi05" && o.model_type != "pi0_fast")
    throw UserError("model.type: got '" + o.model_type + "', expected pi0, pi05 or pi0_fast");
  if (o.max_token_len == 0) o.max_token_len = o.model_type == "pi0" ? 48 : o.model_type == "pi05" ? 200 : 250;
  if (o.max_token_len < 1)
    throw UserError("model.max_token_len: got " + std::to_string(o.max_token_len) + ", expected >= 1");
  if (o.norm == "auto") o.norm = o.model_type == "pi0" ? "zscore" : "quantile";
  if (o.norm != "zscore" && o.norm != "quantile" && o.norm != "none")
    throw UserError("norm: got '" + o.norm + "', expected auto, zscore, quantile or none");
  if (o.image_size < 1) throw UserError("model.image_size: got " + std::to_string(o.image_size) + ", expected >= 1");
  if (o.action_dim < 1) throw UserError("model.action_dim: got " + std::to_string(o.action_dim) + ", expected >= 1");
  return o;
}

NormMode TransformOptions::norm_mode() const {
  const std::string n = resolved().norm;
  return n == "zscore" ? NormMode::kZScore : n == "quantile" ? NormMode::kQuantile : NormMode::kNone;
}

SampleTransform::SampleTransform(TransformOptions options, NormStats stats, std::shared_ptr<const Tokenizer> tokenizer)
    : options_(options.resolved()), stats_(std::move(stats)), tokenizer_(std::move(tokenizer)) {
  PI0_CHECK(tokenizer_ != nullptr, "SampleTransform needs a tokenizer");
  PI0_CHECK((options_.model_type == "pi0_fast") == (options_.fast_prompt != nullptr),
            "a FastPromptTokenizer is needed with model type pi0_fast, and only there");
  if (options_.fast_tokenizer) {
    PI0_CHECK(options_.max_fast_tokens > 0, "a FAST block needs max_fast_tokens > 0");
    // openpi's pi0-FAST postfix ends with spm.encode("|", add_eos=True).
    for (const int id : tokenizer_->encode("|")) fast_end_.push_back(id);
    fast_end_.push_back(tokenizer_->eos_id());
  }
  if (options_.norm != "none") {
    stats_.at("state");
    stats_.at("actions");
  }
}

void SampleTransform::check_dims(int64_t state_dim, int64_t action_dim, const std::string& dataset,
                                 const std::string& mask_key) const {
  // At start rather than at the first sample: the mask is the robot's, the dims are the dataset's.
  const auto mask = static_cast<int64_t>(options_.delta_action_mask.size());
  if (mask > std::min(state_dim, action_dim))
    throw UserError(mask_key + ": " + std::to_string(mask) + " entries, expected at most " +
                    std::to_string(std::min(state_dim, action_dim)) + " (the state dim " + std::to_string(state_dim) +
                    " and action dim " + std::to_string(action_dim) + " of " + dataset + ")");
  const std::string src = stats_.source.empty() ? "norm stats" : stats_.source;
  const NormMode mode = options_.norm_mode();
  normalize(torch::zeros({state_dim}), mode == NormMode::kNone ? KeyStats{} : stats_.at("state"), mode,
            src + ": key norm_stats.state");
  normalize(torch::zeros({action_dim}), mode == NormMode::kNone ? KeyStats{} : stats_.at("actions"), mode,
            src + ": key norm_stats.actions");
  if (state_dim > options_.action_dim || action_dim > options_.action_dim)
    throw UserError("model.action_dim: got " + std::to_string(options_.action_dim) + ", expected >= the state dim " +
                    std::to_string(state_dim) + " and action dim " + std::to_string(action_dim) + " of " + dataset);
}

ProcessedSample SampleTransform::operator()(const RawSample& raw, std::optional<uint64_t> augment_seed) const {
  const NormMode mode = options_.norm_mode();
  const std::string src = stats_.source.empty() ? "norm stats" : stats_.source;
  ProcessedSample out;
  torch::Tensor actions = delta_actions(raw.actions, raw.state, options_.delta_action_mask, "delta_action_mask");
  torch::Tensor state = raw.state;
  if (mode != NormMode::kNone) {
    state = normalize(state, stats_.at("state"), mode, src + ": key norm_stats.state");
    actions = normalize(actions, stats_.at("actions"), mode, src + ": key norm_stats.actions");
  }
  if (options_.fast_prompt) {
    // openpi's pi0-FAST: prompt, state bins and the FAST tokens of the robot's own action dims in one token row
    // (its transforms pad neither state nor actions).
    auto ft = options_.fast_prompt->tokenize(raw.prompt, state, actions, options_.max_token_len);
    out.tokens = ft.tokens;
    out.token_mask = ft.mask;
    out.token_ar_mask = ft.ar_mask;
    out.token_loss_mask = ft.loss_mask;
  } else {
    const bool discrete_state = options_.model_type == "pi05" && options_.discrete_state_input;
    TokenizedPrompt tp =
        tokenizer_->tokenize(raw.prompt, options_.max_token_len, discrete_state ? state : torch::Tensor());
    out.tokens = tp.tokens;
    out.token_mask = tp.mask;
  }
  out.state = pad_last_dim(state, options_.action_dim).to(torch::kFloat32);
  out.actions = pad_last_dim(actions, options_.action_dim).to(torch::kFloat32);
  out.valid_rows = raw.valid_rows;
  out.action_dims = actions.size(-1);
  if (options_.fast_tokenizer) add_fast_block(out, actions);
  if (options_.max_subtask_tokens > 0) add_subtask_block(out, raw.subtask);

  std::optional<Rng> rng;
  if (augment_seed) rng.emplace(*augment_seed);
  const int64_t S = options_.image_size;
  for (size_t slot = 0; slot < raw.images.size(); ++slot) {
    if (!raw.image_masks[slot] || !raw.images[slot].defined()) {
      // Absent camera: a zero uint8 image, i.e. -1 after scaling (openpi's LiberoInputs uses np.zeros_like).
      out.images.push_back(torch::full({3, S, S}, -1.0f));
      out.image_masks.push_back(absent_camera_seen(options_.model_type));
      continue;
    }
    torch::Tensor img = image_to_float(resize_with_pad(raw.images[slot], S));
    if (rng) {
      // One stream per camera so each camera's draws do not depend on the others'.
      Rng cam_rng(sample_seed(rng->next(), 0, static_cast<int64_t>(slot)));
      const bool wrist = model::kCameraNames[slot].find("wrist") != std::string::npos;
      augment_image(img, wrist, cam_rng, options_.augment);
    }
    out.images.push_back(img);
    out.image_masks.push_back(true);
  }
  return out;
}

void SampleTransform::add_fast_block(ProcessedSample& out, const torch::Tensor& actions) const {
  // The robot's own dims, not the zero padding to model.action_dim: padded dims would spend the BPE merges and the
  // CE on constant zeros (the departure of OpenTau the recipe avoids; docs/ki.md).
  const auto fast_ids = options_.fast_tokenizer->encode(actions);
  const int64_t vocab = tokenizer_->vocab_size();
  std::vector<int64_t> block;
  block.reserve(fast_ids.size() + fast_end_.size());
  for (const int64_t id : fast_ids) block.push_back(fast_to_paligemma(id, vocab));
  block.insert(block.end(), fast_end_.begin(), fast_end_.end());
  const int64_t f = options_.max_fast_tokens, n = static_cast<int64_t>(block.size());
  out.fast_length = n;
  if (n > f) {
    // As openpi's FASTTokenizer: cut, and say so; once per pipeline here rather than once per sample, with the count
    // so far, so a long run's log is not flooded.
    if (fast_truncations_->fetch_add(1) == 0) {
      spdlog::warn("train.ki: a FAST block of {} tokens is longer than train.ki.max_fast_tokens ({}) and is "
                   "truncated (its end token lost); raise max_fast_tokens (warned once, further truncations counted)",
                   n, f);
    }
    block.resize(static_cast<size_t>(f));
  }
  out.fast_tokens = torch::zeros({f}, torch::kInt64);
  out.fast_mask = torch::zeros({f}, torch::kBool);
  const int64_t kept = std::min(n, f);
  std::copy(block.begin(), block.begin() + kept, out.fast_tokens.data_ptr<int64_t>());
  out.fast_mask.narrow(0, 0, kept).fill_(true);
}

void SampleTransform::add_subtask_block(ProcessedSample& out, const std::string& text) const {
  const int64_t t = options_.max_subtask_tokens;
  out.subtask_tokens = torch::zeros({t}, torch::kInt64);
  out.subtask_mask = torch::zeros({t}, torch::kBool);
  out.subtask_targets = torch::zeros({t}, torch::kBool);
  const std::string cleaned = Tokenizer::clean(text);
  if (cleaned.empty()) return;  // no label: nothing to predict, and nothing the expert reads
  // The cue and the text are encoded apart so the cue's tokens are the same in every block and at inference, where
  // they are fed before decoding starts.
  std::vector<int64_t> block;
  for (const int id : tokenizer_->encode(options_.subtask_cue)) block.push_back(id);
  const int64_t cue = static_cast<int64_t>(block.size());
  for (const int id : tokenizer_->encode(cleaned)) block.push_back(id);
  block.push_back(tokenizer_->eos_id());
  const int64_t n = static_cast<int64_t>(block.size());
  out.subtask_length = n;
  if (n > t) {
    if (subtask_truncations_->fetch_add(1) == 0) {
      spdlog::warn("train.subtask: a subtask block of {} tokens (cue, text, EOS) is longer than "
                   "train.subtask.max_tokens ({}) and is truncated (its EOS lost); raise max_tokens (warned once, "
                   "further truncations counted)", n, t);
    }
    block.resize(static_cast<size_t>(t));
  }
  const int64_t kept = std::min(n, t);
  std::copy(block.begin(), block.begin() + kept, out.subtask_tokens.data_ptr<int64_t>());
  out.subtask_mask.narrow(0, 0, kept).fill_(true);
  if (kept > cue) out.subtask_targets.narrow(0, cue, kept - cue).fill_(true);
}

model::Batch collate(const std::vector<ProcessedSample>& samples) {
  PI0_CHECK(!samples.empty(), "collate: empty batch");
  model::Batch b;
  const size_t n_cam = samples[0].images.size();
  for (size_t c = 0; c < n_cam; ++c) {
    std::vector<torch::Tensor> imgs;
    std::vector<uint8_t> masks;
    for (const auto& s : samples) {
      imgs.push_back(s.images[c]);
      masks.push_back(s.image_masks[c] ? 1 : 0);
    }
    b.observation.images.push_back(torch::stack(imgs));
    b.observation.image_masks.push_back(
        torch::tensor(std::vector<int64_t>(masks.begin(), masks.end()), torch::kLong).to(torch::kBool));
  }
  std::vector<torch::Tensor> st, tok, tm, act;
  std::vector<int64_t> rows, dims;
  for (const auto& s : samples) {
    st.push_back(s.state);
    tok.push_back(s.tokens);
    tm.push_back(s.token_mask);
    act.push_back(s.actions);
    rows.push_back(s.valid_rows);
    dims.push_back(s.action_dims);
  }
  b.action_rows = torch::tensor(rows, torch::kInt64);
  b.action_dims = torch::tensor(dims, torch::kInt64);
  b.observation.state = torch::stack(st);
  b.observation.tokenized_prompt = torch::stack(tok);
  b.observation.tokenized_prompt_mask = torch::stack(tm);
  b.actions = torch::stack(act);
  if (samples[0].token_ar_mask.defined()) {
    std::vector<torch::Tensor> ar, lm;
    for (const auto& s : samples) ar.push_back(s.token_ar_mask), lm.push_back(s.token_loss_mask);
    b.token_ar_mask = torch::stack(ar);
    b.token_loss_mask = torch::stack(lm);
  }
  if (samples[0].fast_tokens.defined()) {
    std::vector<torch::Tensor> ft, fm;
    for (const auto& s : samples) ft.push_back(s.fast_tokens), fm.push_back(s.fast_mask);
    b.fast_tokens = torch::stack(ft);
    b.fast_mask = torch::stack(fm);
  }
  if (samples[0].subtask_tokens.defined()) {
    std::vector<torch::Tensor> st_tok, st_mask, st_tgt;
    for (const auto& s : samples)
      st_tok.push_back(s.subtask_tokens), st_mask.push_back(s.subtask_mask), st_tgt.push_back(s.subtask_targets);
    b.subtask_tokens = torch::stack(st_tok);
    b.subtask_mask = torch::stack(st_mask);
    b.subtask_targets = torch::stack(st_tgt);
  }
  return b;
}

}  // namespace pi0::data
