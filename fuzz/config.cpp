// libFuzzer target: the config loader (src/pi0/config/config.cpp): a YAML file plus --set overrides, then
// validation and the resolved-config dump. Lines starting with "#set " carry the overrides (a YAML comment, so the
// same input is also a valid file): "#set train.lr=1e-4".
#include <sstream>

#include "fuzz_util.h"
#include "pi0/config/config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pi0::fuzz::quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("#set ", 0) == 0) overrides.push_back(line.substr(5));
  const std::string path = pi0::fuzz::write_input(data, size, "config.yaml");
  return pi0::fuzz::refuse_only_with_user_error([&] {
    const pi0::config::Config cfg = pi0::config::load_config(path, overrides);
    pi0::config::validate(cfg);
    (void)YAML::Dump(pi0::config::to_yaml(cfg));
  });
}
