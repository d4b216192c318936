// Each transform against hand-computed values.
#include <catch2/catch.hpp>

#include "pi0/data/transforms.h"

using namespace pi0::data;

namespace {
torch::Tensor row_image(const std::vector<int>& values) {  // [1,W,3], same value in every channel
  torch::Tensor t = torch::empty({1, static_cast<int64_t>(values.size()), 3}, torch::kUInt8);
  for (size_t i = 0; i < values.size(); ++i) t[0][static_cast<int64_t>(i)].fill_(values[i]);
  return t;
}
std::vector<int> row_values(const torch::Tensor& img) {
  std::vector<int> out;
  for (int64_t x = 0; x < img.size(1); ++x) out.push_back(img[0][x][0].item<int>());
  return out;
}
}  // namespace

TEST_CASE("delta and absolute actions with a mask", "[unit][data]") {
  torch::Tensor actions = torch::tensor({1.f, 1.f, 1.f, 2.f, 2.f, 2.f}).view({2, 3});
  torch::Tensor state = torch::tensor({0.5f, 1.f, 9.f});
  torch::Tensor d = delta_actions(actions, state, {true, false}, "test");
  CHECK(d[0][0].item<float>() == Approx(0.5));
  CHECK(d[1][0].item<float>() == Approx(1.5));
  CHECK(d[0][1].item<float>() == Approx(1.0));  // mask false: untouched
  CHECK(d[1][2].item<float>() == Approx(2.0));  // beyond the mask: untouched
  CHECK(torch::allclose(absolute_actions(d, state, {true, false}), actions));
  CHECK(torch::equal(delta_actions(actions, state, {}, "test"), actions));
}

TEST_CASE("z-score and quantile normalization match openpi's formulas", "[unit][data]") {
  KeyStats ks{{0.0, 1.0, 7.0}, {1.0, 2.0, 7.0}, {0.0, 0.0, 7.0}, {2.0, 4.0, 7.0}};
  torch::Tensor x = torch::tensor({1.f, 2.f});
  torch::Tensor z = normalize(x, ks, NormMode::kZScore, "t");  // stats truncated to x's 2 dims
  CHECK(z[0].item<float>() == Approx(1.0 / (1.0 + 1e-6)));
  CHECK(z[1].item<float>() == Approx(1.0 / (2.0 + 1e-6)));
  torch::Tensor q = normalize(x, ks, NormMode::kQuantile, "t");
  CHECK(q[0].item<float>() == Approx(1.0 / (2.0 + 1e-6) * 2.0 - 1.0).margin(1e-7));
  CHECK(q[1].item<float>() == Approx(2.0 / (4.0 + 1e-6) * 2.0 - 1.0).margin(1e-7));
  // No clipping: far outside [q01, q99] stays far outside [-1, 1].
  CHECK(normalize(torch::tensor({10.f, 0.f}), ks, NormMode::kQuantile, "t")[0].item<float>() == Approx(9.0).epsilon(1e-5));
  CHECK(torch::allclose(unnormalize(z, ks, NormMode::kZScore), x, 1e-5, 1e-6));
  CHECK(torch::allclose(unnormalize(q, ks, NormMode::kQuantile), x, 1e-5, 1e-6));
  // Unnormalize on a padded vector: z-score pads mean 0 / std 1, quantile passes extra dims through.
  torch::Tensor padded = torch::tensor({0.f, 0.f, 0.f, 5.f});
  CHECK(unnormalize(padded, ks, NormMode::kZScore)[3].item<float>() == Approx(5.0 * (1 + 1e-6)));
  CHECK(unnormalize(padded, ks, NormMode::kQuantile)[3].item<float>() == 5.f);
}

TEST_CASE("zero padding of state and actions", "[unit][data]") {
  torch::Tensor p = pad_last_dim(torch::ones({2, 3}), 5);
  CHECK(p.sizes() == torch::IntArrayRef({2, 5}));
  CHECK(p.sum().item<float>() == 6.f);
  CHECK(pad_last_dim(torch::ones({7}), 4).size(0) == 7);  // no truncation
}

TEST_CASE("bilinear resize matches the triangle-filter values", "[unit][data]") {
  // Upscale 2 -> 4: [a, .75a+.25b, .25a+.75b, b].
  CHECK(row_values(resize_bilinear(row_image({0, 100}), 1, 4)) == std::vector<int>{0, 25, 75, 100});
  // Downscale 4 -> 2: the filter widens to 2 input pixels (antialiasing), weights .75/.75/.25 and .25/.75/.75.
  CHECK(row_values(resize_bilinear(row_image({0, 100, 200, 40}), 1, 2)) == std::vector<int>{71, 117});
}

TEST_CASE("resize_with_pad keeps the aspect ratio and pads like openpi", "[unit][data]") {
  torch::Tensor img = torch::full({2, 4, 3}, 200, torch::kUInt8);
  torch::Tensor out = resize_with_pad(img, 4);
  REQUIRE(out.sizes() == torch::IntArrayRef({4, 4, 3}));
  CHECK(out[0].sum().item<int64_t>() == 0);
  CHECK(out[3].sum().item<int64_t>() == 0);
  CHECK(out[1].min().item<int>() == 200);
  CHECK(out[2].min().item<int>() == 200);
  // Odd padding: 3 rows in 4 -> offset int(1/2) = 0, the extra row goes to the bottom.
  torch::Tensor odd = resize_with_pad(torch::full({3, 4, 3}, 9, torch::kUInt8), 4);
  CHECK(odd[0].min().item<int>() == 9);
  CHECK(odd[3].sum().item<int64_t>() == 0);
  // 128 -> 224 upscaling fills the whole square; already-square-size images are returned unchanged.
  CHECK(resize_with_pad(torch::full({128, 128, 3}, 50, torch::kUInt8), 224).min().item<int>() == 50);
  torch::Tensor same = torch::randint(0, 255, {8, 8, 3}).to(torch::kUInt8);
  CHECK(torch::equal(resize_with_pad(same, 8), same));
  // 480x640 -> 224: 168 rows, centered with 28 black rows above.
  torch::Tensor wide = resize_with_pad(torch::full({480, 640, 3}, 255, torch::kUInt8), 224);
  CHECK(wide[27].max().item<int>() == 0);
  CHECK(wide[28].min().item<int>() == 255);
  CHECK(wide[28 + 167].min().item<int>() == 255);
  CHECK(wide[28 + 168].max().item<int>() == 0);
}

TEST_CASE("uint8 images map to -1..1 in NCHW", "[unit][data]") {
  torch::Tensor img = torch::zeros({1, 2, 3}, torch::kUInt8);
  img[0][1][0] = 255;
  img[0][1][2] = 51;
  torch::Tensor f = image_to_float(img);
  REQUIRE(f.sizes() == torch::IntArrayRef({3, 1, 2}));
  CHECK(f[0][0][0].item<float>() == -1.f);
  CHECK(f[0][0][1].item<float>() == 1.f);
  CHECK(f[2][0][1].item<float>() == Approx(51.0 / 255.0 * 2.0 - 1.0));
}

TEST_CASE("augmentation is seeded, geometric only off the wrist, and exact for neutral settings", "[unit][data]") {
  torch::Tensor base = image_to_float(torch::randint(0, 255, {32, 32, 3}).to(torch::kUInt8));
  auto run = [&](uint64_t seed, bool wrist, AugmentOptions o = {}) {
    torch::Tensor x = base.clone();
    Rng rng(seed);
    augment_image(x, wrist, rng, o);
    return x;
  };
  CHECK(torch::equal(run(5, false), run(5, false)));
  CHECK(!torch::equal(run(5, false), run(6, false)));
  // Neutral geometry (no crop, no rotation) and no jitter: identity.
  AugmentOptions neutral;
  neutral.crop_scale = 1.0;
  neutral.max_rotation_deg = 0.0;
  neutral.jitter_prob = 0.0;
  CHECK(torch::allclose(run(1, false, neutral), base, 0, 1e-6));
  // Wrist without jitter: untouched (no crop / rotation on wrist cameras).
  AugmentOptions no_jitter;
  no_jitter.jitter_prob = 0.0;
  CHECK(torch::allclose(run(3, true, no_jitter), base, 0, 1e-6));
  CHECK(!torch::allclose(run(3, false, no_jitter), base, 0, 1e-3));
  // Brightness on a gray image (contrast 0, hue irrelevant at saturation 0): v -> v(1+b) or v(1-b)+b.
  AugmentOptions bright;
  bright.contrast = 0.0;
  bright.jitter_prob = 1.0;
  torch::Tensor gray = torch::zeros({3, 4, 4});  // 0 in [-1,1] = 0.5 in [0,1]
  Rng rng(11);
  augment_image(gray, true, rng, bright);
  Rng replay(11);
  const double b = replay.uniform(-0.3, 0.3);
  const double v = b < 0 ? 0.5 * (1 + b) : 0.5 * (1 - b) + b;
  CHECK(gray[1][2][3].item<float>() == Approx(v * 2 - 1).margin(1e-5));
}
