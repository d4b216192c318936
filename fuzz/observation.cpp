// libFuzzer target: the observation reader of pi0-infer and pi0-serve (src/pi0/data/observation_file.cpp) on a
// safetensors file, as pi0-infer reads --obs: keys, dtypes, shapes, value checks, resize-with-pad, normalization.
// The format is a small pi0 model (image side 16, action_dim 8, z-score stats of 6 dims, 64 token ids).
#include "fuzz_util.h"
#include "pi0/data/observation_file.h"
#include "pi0/io/safetensors.h"

namespace {

pi0::data::NormStats stats() {
  pi0::data::NormStats s;
  s.keys["state"] = {{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {1, 2, 3, 4, 5, 6}, {-1, -1, -1, -1, -1, -1}, {1, 1, 1, 1, 1, 1}};
  s.source = "norm_stats.json";
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pi0::fuzz::quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const pi0::data::NormStats kStats = stats();
  static const pi0::data::ObservationFormat kFormat = [] {
    pi0::data::ObservationFormat f;
    f.transform.image_size = 16;
    f.transform.action_dim = 8;
    f.transform = f.transform.resolved();
    f.norm_stats = &kStats;
    f.vocab_size = 64;
    return f;
  }();
  const std::string path = pi0::fuzz::write_input(data, size, "obs.safetensors");
  return pi0::fuzz::refuse_only_with_user_error([&] {
    const auto tensors = pi0::io::read_safetensors(path);
    const auto in = pi0::data::read_observation(tensors, kFormat, path, std::nullopt, nullptr);
    const auto& o = in.observation;
    if (o.images.size() != 3 || o.state.size(1) != 8 || o.tokenized_prompt.size(0) != o.batch_size()) std::abort();
    if (!torch::isfinite(o.state).all().item<bool>()) std::abort();  // the model must never see NaN or Inf
    for (const auto& img : o.images)
      if (img.size(2) != 16 || img.size(3) != 16 || !torch::isfinite(img).all().item<bool>()) std::abort();
  });
}
