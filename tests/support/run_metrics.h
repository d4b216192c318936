// Reading a run's metrics.jsonl back in tests: one metric by step.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "pi0/train/metrics.h"

namespace pi0::testing {

/// step -> value of `key` in the records of `run_dir`/metrics.jsonl that have it.
inline std::map<int64_t, double> metric_by_step(const std::string& run_dir, const std::string& key) {
  std::map<int64_t, double> out;
  for (const auto& r : train::read_metrics(run_dir + "/metrics.jsonl"))
    if (r.contains(key)) out[r.at("step").get<int64_t>()] = r.at(key).get<double>();
  return out;
}

}  // namespace pi0::testing
