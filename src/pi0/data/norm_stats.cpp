#include "pi0/data/norm_stats.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/data/dataset.h"
#include "pi0/data/transforms.h"

namespace pi0::data {

const KeyStats& NormStats::at(const std::string& key) const {
  auto it = keys.find(key);
  if (it == keys.end())
    throw UserError((source.empty() ? std::string("norm stats") : source) + ": key norm_stats." + key +
                    " not found, expected stats for state and actions");
  return it->second;
}

NormStats load_norm_stats(const std::string& path) {
  require_input_file(path, "", "a norm_stats.json file");  // the true reason: missing, unreadable, not a file
  std::ifstream in(path);
  if (!in) throw UserError(path + ": cannot read norm stats (" + errno_reason(errno) + ")");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw UserError(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.contains("norm_stats") || !j["norm_stats"].is_object())
    throw UserError(path + ": key norm_stats not found, expected {\"norm_stats\": {\"state\": {...}, \"actions\": {...}}}");
  NormStats out;
  out.source = path;
  for (auto& item : j["norm_stats"].items()) {
    const std::string key = item.key();  // not a structured binding: C++17 lambdas cannot capture those (clang)
    const auto& v = item.value();
    KeyStats ks;
    auto field = [&](const char* name, std::vector<double>& dst, bool required) {
      if (!v.contains(name) || v.at(name).is_null()) {
        if (required) throw UserError(path + ": key norm_stats." + key + "." + name + " not found");
        return;
      }
      try {
        dst = v.at(name).get<std::vector<double>>();
      } catch (const std::exception&) {
        throw UserError(path + ": key norm_stats." + key + "." + name + " is not a list of numbers");
      }
    };
    field("mean", ks.mean, true);
    field("std", ks.std, true);
    field("q01", ks.q01, false);
    field("q99", ks.q99, false);
    const size_t d = ks.mean.size();
    if (ks.std.size() != d || (!ks.q01.empty() && ks.q01.size() != d) || (!ks.q99.empty() && ks.q99.size() != d))
      throw UserError(path + ": key norm_stats." + key + " has fields of different lengths (mean has " +
                      std::to_string(d) + ")");
    if (ks.q01.empty() != ks.q99.empty())
      throw UserError(path + ": key norm_stats." + key + " has only one of q01 / q99, expected both or neither");
    out.keys[key] = ks;
  }
  return out;
}

void save_norm_stats(const NormStats& stats, const std::string& path) {
  nlohmann::json j;
  j["norm_stats"] = nlohmann::json::object();
  for (const auto& [key, ks] : stats.keys) {
    nlohmann::json k;
    k["mean"] = ks.mean;
    k["std"] = ks.std;
    if (!ks.q01.empty()) k["q01"] = ks.q01;
    if (!ks.q99.empty()) k["q99"] = ks.q99;
    j["norm_stats"][key] = k;
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

namespace {

/// Two-pass per-dimension statistics over weighted rows: pass 1 (add) gathers min/max/sum/sum of squares, pass 2
/// (add_to_histogram) bins the same rows once the range is known.
class DimStats {
 public:
  DimStats(int64_t dim, int64_t bins)
      : dim_(dim), bins_(bins), min_(dim, INFINITY), max_(dim, -INFINITY), sum_(dim, 0.0), sumsq_(dim, 0.0),
        hist_(static_cast<size_t>(dim * bins), 0.0) {}

  void add(const float* row, double w) {
    for (int64_t d = 0; d < dim_; ++d) {
      const double x = row[d];
      min_[d] = std::min(min_[d], x);
      max_[d] = std::max(max_[d], x);
      sum_[d] += w * x;
      sumsq_[d] += w * x * x;
    }
    count_ += w;
  }

  void add_to_histogram(const float* row, double w) {
    for (int64_t d = 0; d < dim_; ++d) {
      const double lo = min_[d] - 1e-10, hi = max_[d] + 1e-10;
      int64_t b = static_cast<int64_t>((row[d] - lo) / (hi - lo) * static_cast<double>(bins_));
      b = std::clamp<int64_t>(b, 0, bins_ - 1);
      hist_[static_cast<size_t>(d * bins_ + b)] += w;
    }
  }

  KeyStats finish() const {
    KeyStats ks;
    for (int64_t d = 0; d < dim_; ++d) {
      const double mean = sum_[d] / count_;
      ks.mean.push_back(mean);
      ks.std.push_back(std::sqrt(std::max(0.0, sumsq_[d] / count_ - mean * mean)));
      ks.q01.push_back(quantile(d, 0.01));
      ks.q99.push_back(quantile(d, 0.99));
    }
    return ks;
  }

  double count() const { return count_; }

 private:
  /// Left edge of the first bin whose cumulative count reaches q·N (numpy searchsorted, side='left').
  double quantile(int64_t d, double q) const {
    const double lo = min_[d] - 1e-10, hi = max_[d] + 1e-10;
    const double target = q * count_;
    double cum = 0.0;
    int64_t b = 0;
    for (; b < bins_; ++b) {
      cum += hist_[static_cast<size_t>(d * bins_ + b)];
      if (cum >= target) break;
    }
    b = std::min(b, bins_ - 1);
    return lo + (hi - lo) * static_cast<double>(b) / static_cast<double>(bins_);
  }

  int64_t dim_, bins_;
  std::vector<double> min_, max_, sum_, sumsq_, hist_;
  double count_ = 0.0;
};

}  // namespace

NormStats compute_norm_stats(const RobotDataset& dataset, const NormStatsOptions& options) {
  PI0_CHECK(options.num_bins >= 1, "num_bins must be >= 1");
  if (dataset.size() < 2) throw UserError("norm stats: the dataset has " + std::to_string(dataset.size()) +
                                          " frame(s), expected at least 2");
  const int64_t H = dataset.action_horizon();
  const bool delta = std::any_of(options.delta_action_mask.begin(), options.delta_action_mask.end(),
                                 [](bool b) { return b; });
  DimStats state(dataset.state_dim(), options.num_bins);
  DimStats actions(dataset.action_dim(), options.num_bins);

  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t e = 0; e < dataset.num_episodes(); ++e) {
      const EpisodeInfo& ep = dataset.episode(e);
      const int64_t T = ep.length;
      const float* s = ep.state.data_ptr<float>();
      for (int64_t t = 0; t < T; ++t) {
        if (pass == 0) state.add(s + t * dataset.state_dim(), 1.0);
        else state.add_to_histogram(s + t * dataset.state_dim(), 1.0);
      }
      if (delta) {
        // Rows depend on the chunk's start state: accumulate chunk by chunk.
        for (int64_t t = 0; t < T; ++t) {
          torch::Tensor chunk = delta_actions(dataset.action_chunk(e, t), ep.state[t], options.delta_action_mask,
                                              "norm stats").contiguous();
          const float* a = chunk.data_ptr<float>();
          for (int64_t h = 0; h < H; ++h) {
            if (pass == 0) actions.add(a + h * dataset.action_dim(), 1.0);
            else actions.add_to_histogram(a + h * dataset.action_dim(), 1.0);
          }
        }
      } else {
        // Row j appears in the chunks of every t with min(t+h, T-1) == j: count those once and weight the row.
        std::vector<double> weight(static_cast<size_t>(T), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t inside = std::min(H, T - t);
          for (int64_t j = t; j < t + inside; ++j) weight[static_cast<size_t>(j)] += 1.0;
          weight[static_cast<size_t>(T - 1)] += static_cast<double>(H - inside);
        }
        const float* a = ep.actions.data_ptr<float>();
        for (int64_t j = 0; j < T; ++j) {
          if (pass == 0) actions.add(a + j * dataset.action_dim(), weight[static_cast<size_t>(j)]);
          else actions.add_to_histogram(a + j * dataset.action_dim(), weight[static_cast<size_t>(j)]);
        }
      }
    }
  }
  NormStats out;
  out.keys["state"] = state.finish();
  out.keys["actions"] = actions.finish();
  for (const auto& w : near_constant_dims(out)) spdlog::warn("{}", w);
  return out;
}

std::vector<std::string> near_constant_dims(const NormStats& stats) {
  std::vector<std::string> out;
  for (const auto& [key, ks] : stats.keys) {
    for (size_t d = 0; d < ks.mean.size(); ++d) {
      const bool q_small = !ks.q01.empty() && ks.q99[d] - ks.q01[d] < 1e-3;
      const bool s_small = ks.std[d] < 1e-4;
      if (q_small || s_small) {
        out.push_back(fmt::format(
            "norm stats: {} dim {} is near constant (q01 {:.6g}, q99 {:.6g}, std {:.3g}); normalization divides by "
            "~1e-6 there and can blow up the loss — check the data or edit norm_stats.json",
            key, d, ks.q01.empty() ? NAN : ks.q01[d], ks.q99.empty() ? NAN : ks.q99[d], ks.std[d]));
      }
    }
  }
  return out;
}

}  // namespace pi0::data
