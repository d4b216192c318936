// A tiny training setup shared by the trainer and CUDA integration tests: generated LIBERO-layout episodes and
// their norm stats in a temp dir, and configs/debug.yaml pointed at them.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "pi0/config/config.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/norm_stats.h"
#include "pi0/train/metrics.h"
#include "support/test_support.h"

namespace pi0::testing {

/// The FAST tokenizer the tests fitted (tests/data/fast_reference.py's "a": vocab 256, string merges).
inline const std::string kTestFastTokenizer = std::string(PI0_SOURCE_DIR) + "/tests/data/golden/fast/tokenizer_a";

/// `base` followed by `more`: a test's settings for a variant of the tiny run, plus the case's own.
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

/// One key's values over a run's metrics.jsonl, in the order logged (records without the key skipped).
inline std::vector<double> metrics_column(const std::string& run_dir, const std::string& key) {
  std::vector<double> out;
  for (const auto& r : train::read_metrics(run_dir + "/metrics.jsonl"))
    if (r.contains(key)) out.push_back(r.at(key).get<double>());
  return out;
}

/// Two short example episodes (16-pixel images) under `dir`/data and their norm stats at `dir`/stats.json: the data
/// pipeline a parity test's trainer needs to exist, whose batches it never draws (train_step gets the fixture's).
/// Returns the episode file.
inline std::string write_unread_training_data(const TempDir& dir) {
  data::ExampleDataOptions eo;
  eo.episodes = 2;
  eo.steps = 8;
  eo.image_size = 16;
  const auto data_file = data::write_example_libero(dir.str("data"), eo);
  data::DatasetOptions d;
  d.paths = {data_file};
  d.action_horizon = 4;
  data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), dir.str("stats.json"));
  return data_file;
}

// Example data + norm stats in a temp dir, and the debug config pointed at them.
struct TinyRun {
  TempDir dir{"pi0train"};
  std::string data_glob, norm_stats;

  TinyRun() {
    data::ExampleDataOptions eo;
    eo.episodes = 6;
    eo.steps = 30;
    data::write_example_libero(dir.str("data"), eo);
    data_glob = dir.str("data") + "/*.hdf5";
    data::DatasetOptions d;
    d.paths = {data_glob};
    d.action_horizon = 8;
    norm_stats = dir.str("norm_stats.json");
    data::save_norm_stats(data::compute_norm_stats(data::RobotDataset(d)), norm_stats);
  }

  config::Config config(const std::string& run, std::vector<std::string> extra = {}) const {
    std::vector<std::string> o = {"data.dataset.paths=[" + data_glob + "]", "data.norm_stats=" + norm_stats,
                                  "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model",
                                  "checkpoint.run_dir=" + dir.str(run), "train.log_interval=1",
                                  "train.batch_size=8", "data.num_workers=1"};
    o.insert(o.end(), extra.begin(), extra.end());
    return config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml", o);
  }

  /// config(run, extra) written as a YAML file dir/<name> (the apps read files); returns its path.
  std::string write_config(const std::string& name, const std::string& run,
                           const std::vector<std::string>& extra = {}) const {
    const auto path = dir.str(name);
    std::ofstream(path) << YAML::Dump(config::to_yaml(config(run, extra)));
    return path;
  }
};

}  // namespace pi0::testing
