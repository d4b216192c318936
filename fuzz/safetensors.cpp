// libFuzzer target: the safetensors reader (src/pi0/io/safetensors.cpp), on every path the products use: the
// header parse and validation, lazy views, owned copies and the read-all map of pi0-infer.
#include "fuzz_util.h"
#include "pi0/io/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pi0::fuzz::quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pi0::fuzz::write_input(data, size, "input.safetensors");
  return pi0::fuzz::refuse_only_with_user_error([&] {
    pi0::io::SafetensorsFile file(path);
    for (const auto& name : file.names()) {
      const auto& info = file.info(name);
      const torch::Tensor view = file.get(name);
      if (view.numel() != info.numel()) std::abort();
      const torch::Tensor copy = file.get_copy(name);
      if (!copy.is_contiguous() || copy.numel() != view.numel()) std::abort();
    }
    (void)file.metadata();
    (void)pi0::io::read_safetensors(path);
  });
}
