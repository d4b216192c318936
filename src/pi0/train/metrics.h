// Metrics as JSON Lines: one JSON object per line (e.g. {"step":100,"loss":0.05,"lr":2.5e-5,"grad_norm":0.8}),
// flushed after every record so a crash loses at most the line being written. Read back by pi0-plot. With
// train.tensorboard every record also goes to a TensorBoard event file: every value reaches both, whoever logs it.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/train/tensorboard.h"

namespace pi0::train {

class MetricsWriter {
 public:
  /// Appends to `path` (created with its parent directories). With drop_from_step >= 0 (a resumed run),
  /// existing records whose "step" is >= drop_from_step are removed first: they belong to the interrupted run
  /// after the checkpoint that is being resumed. UserError if the file cannot be opened.
  explicit MetricsWriter(const std::string& path, int64_t drop_from_step = -1);

  /// Writes one record as one line and flushes, and to the TensorBoard mirror (if any) its numeric values at its
  /// "step" as one event. NOTE: JSON has no NaN/Inf; nlohmann writes them as null (TensorBoard keeps them).
  void write(const nlohmann::json& record);
  /// {"step": step, name: value, ...}
  void write(int64_t step, const std::map<std::string, double>& values);

  const std::string& path() const { return path_; }

  /// Every record written from now on also goes to `tensorboard` (train.tensorboard).
  void mirror_to(std::unique_ptr<TensorBoardWriter> tensorboard) { tensorboard_ = std::move(tensorboard); }
  /// The mirror, for what has no metrics.jsonl record (the first batch's camera views); null without one.
  TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }

 private:
  std::string path_;
  std::ofstream out_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

/// All records of a JSONL file; blank and malformed lines (e.g. a truncated last line after a crash) are
/// skipped. UserError if the file cannot be read.
std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace pi0::train
