// libFuzzer target: YAML anchors and aliases in a config (src/pi0/config/config.cpp). yaml-cpp shares an aliased
// node instead of copying it, so nine lines can describe 9^9 values; every walk of the tree (the duplicate-key
// check, YAML::Clone, the readers) expands them. The config must be refused at once or read in full: a slow input
// is a finding (libFuzzer's -timeout, and -rss_limit_mb for the memory of an expansion). The seeds are a
// "billion laughs" file and a real config that uses anchors; mutation multiplies and nests the aliases.
#include "fuzz_util.h"
#include "pi0/config/config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pi0::fuzz::quiet();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  YAML::Node root;
  try {
    root = YAML::Load(text);  // linear in the text: aliases are shared, not copied
  } catch (const YAML::Exception&) {
    return 0;  // not YAML: load_config refuses it with the line (fuzz/config.cpp covers that path)
  }
  return pi0::fuzz::refuse_only_with_user_error([&] {
    const pi0::config::Config cfg = pi0::config::parse_config(root, "config.yaml", {"train.num_steps=3"});
    (void)YAML::Dump(pi0::config::to_yaml(cfg));
  });
}
