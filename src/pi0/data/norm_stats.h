// Normalization statistics (openpi's NormStats and norm_stats.json) and their computation from a dataset's
// state and action arrays only; images are never decoded.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace pi0::data {

class RobotDataset;

/// Statistics of one key ("state" or "actions"), one value per dimension.
struct KeyStats {
  std::vector<double> mean;
  std::vector<double> std;  ///< population std
  std::vector<double> q01;  ///< may be empty (z-score only files)
  std::vector<double> q99;
};

struct NormStats {
  std::map<std::string, KeyStats> keys;  ///< "state", "actions"
  std::string source;                    ///< file it was read from (for error messages); empty if computed

  /// The stats for `key`; UserError naming source and key if absent.
  const KeyStats& at(const std::string& key) const;
};

/// Reads openpi's `{"norm_stats": {"state": {"mean": [...], "std": [...], "q01": [...], "q99": [...]}, ...}}`.
NormStats load_norm_stats(const std::string& path);
/// Writes the same format (indent 2, like openpi's pydantic dump).
void save_norm_stats(const NormStats& stats, const std::string& path);

struct NormStatsOptions {
  /// Applied to each action chunk before accumulating (openpi computes stats after its data transforms, so
  /// delta-converted actions get delta stats). Empty: absolute actions.
  std::vector<bool> delta_action_mask;
  /// Histogram bins per dimension for q01/q99 (openpi: 5000).
  int64_t num_bins = 5000;
};

/// Mean, population std, q01 and q99 of the state vectors (one per frame) and of every row of every action chunk
/// (H rows per frame, with the repeat-last rule), as openpi's compute_norm_stats.py. Quantiles: the left edge of the
/// histogram bin where the cumulative count reaches q·N, with `num_bins` bins spanning the exact min..max
/// (±1e-10). openpi's RunningStats grows its range batch by batch and re-bins, so its result depends slightly on
/// batch order; ours does not. Either way a quantile is within one bin width, (max−min)/num_bins, of the exact one.
/// Logs a warning for every near-constant dimension (see near_constant_dims).
NormStats compute_norm_stats(const RobotDataset& dataset, const NormStatsOptions& options = {});

/// Human-readable warnings for dimensions whose q99−q01 < 1e-3 or std < 1e-4: quantile / z-score normalization
/// maps them to huge values (divided by ~1e-6), which makes training diverge.
std::vector<std::string> near_constant_dims(const NormStats& stats);

}  // namespace pi0::data
