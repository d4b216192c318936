// The CPU a test ran on, for tests whose numbers depend on which kernels LibTorch picks: its model name and the
// vector extensions (/proc/cpuinfo flags avx*, amx*, fma, f16c) that steer that choice.
#pragma once
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace pi0::testing {

inline std::string cpu_features() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  std::set<std::string> flags;
  bool have_flags = false;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t"));
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model" && line.rfind("model name", 0) == 0) model = value;
    if (key == "flags" && !have_flags) {
      have_flags = true;
      std::istringstream words(value);
      for (std::string w; words >> w;)
        if (w.rfind("avx", 0) == 0 || w.rfind("amx", 0) == 0 || w == "fma" || w == "f16c") flags.insert(w);
    }
  }
  std::string out = model + " [";
  for (const auto& w : flags) out += (out.back() == '[' ? "" : " ") + w;
  return out + "]";
}

}  // namespace pi0::testing
