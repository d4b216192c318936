// libFuzzer target: the norm-stats reader (openpi's norm_stats.json, src/pi0/data/norm_stats.cpp), then the stats in
// use: normalizing a state with them and the near-constant-dims check.
#include "fuzz_util.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/transforms.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pi0::fuzz::quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pi0::fuzz::write_input(data, size, "norm_stats.json");
  return pi0::fuzz::refuse_only_with_user_error([&] {
    const pi0::data::NormStats stats = pi0::data::load_norm_stats(path);
    (void)pi0::data::near_constant_dims(stats);
    for (const auto& [key, s] : stats.keys) {
      const torch::Tensor x = torch::ones({2, 4});
      (void)pi0::data::normalize(x, s, pi0::data::NormMode::kZScore, path + ": " + key);
      if (!s.q01.empty()) (void)pi0::data::normalize(x, s, pi0::data::NormMode::kQuantile, path + ": " + key);
      (void)pi0::data::unnormalize(x, s, pi0::data::NormMode::kZScore);
    }
  });
}
