// LeRobot datasets (v2.0, v2.1, v3.0) read natively: meta/info.json, episodes, tasks, parquet columns (Arrow C++,
// data/parquet.h), PNG `image` features (data/png.h) and MP4 `video` features (data/video.h). The on-disk format is
// described in docs/data.md ("LeRobot datasets") and shared/docs/lerobot-format.md.
//
// LeRobotSource is one dataset root: its metadata and every episode's low-dim columns (small) are read at open;
// images are read per sample. RobotDataset (data/dataset.h) turns its episodes into the same EpisodeInfo as HDF5
// episodes, so chunks, adapt_to_pi, delta actions, normalization and pi0-norm-stats work unchanged.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace pi0::data {

struct DatasetOptions;

/// LeRobot's tolerance between a query timestamp and the decoded frame's (LeRobotDataset tolerance_s default).
constexpr double kLeRobotToleranceS = 1e-4;

/// One feature of meta/info.json.
struct LeRobotFeature {
  std::string dtype;           ///< "float32", "int64", "image", "video", "string", ...
  std::vector<int64_t> shape;  ///< e.g. [8] or [256,256,3]
  int64_t numel() const;
};

/// One episode: where its rows and videos are, and its low-dim columns.
struct LeRobotEpisode {
  int64_t episode_index = 0;
  int64_t length = 0;
  std::string data_file;               ///< parquet holding its rows
  int64_t first_row = 0;               ///< row of frame 0 in data_file
  std::vector<double> timestamps;      ///< [T] the `timestamp` column (seconds from the episode start)
  std::vector<int64_t> task_index;     ///< [T] the `task_index` column
  std::map<std::string, std::string> video_files;    ///< video feature -> MP4 path
  std::map<std::string, double> video_from_s;        ///< video feature -> episode start inside that MP4 (v3.0)
  std::map<std::string, torch::Tensor> columns;      ///< numeric feature -> [T,D] float64 (state, action, subtask keys)
};

class LeRobotSource {
 public:
  /// Reads meta/ and the low-dim `columns` of every episode (at most `max_episodes` if > 0). UserError naming the
  /// file and key for any problem; `config_key` names the options' section in them (DatasetOptions::config_key).
  /// `subtask_key` (train.subtask.key), when one of `columns`, is named as that key in its errors.
  LeRobotSource(const std::string& root, const std::vector<std::string>& columns, int64_t max_episodes,
                int video_threads, std::string config_key = "dataset", const std::string& subtask_key = "");
  ~LeRobotSource();

  const std::string& root() const { return root_; }
  const std::string& version() const { return version_; }
  double fps() const { return fps_; }
  const std::map<std::string, LeRobotFeature>& features() const { return features_; }
  const std::vector<LeRobotEpisode>& episodes() const { return episodes_; }
  /// Task text of a task_index; UserError if the tasks file has no such task.
  const std::string& task(int64_t task_index) const;

  /// Feature `key`, or UserError naming info.json, `role` (the config key) and listing the dataset's features.
  const LeRobotFeature& feature(const std::string& key, const std::string& role) const;

  /// Frame t of episode `e` (index into episodes()) for an image or video feature, as [H,W,3] uint8 RGB.
  /// Thread-safe: video decoders are per thread (and per file), kept open across calls.
  torch::Tensor read_image(int64_t e, const std::string& key, int64_t t) const;

  /// openpi's LIBERO / ALOHA defaults for the keys left empty in `o`, chosen from the features of the dataset at
  /// `root` (format: lerobot). Also resolves adapt_to_pi "auto" (true for ALOHA-like datasets).
  static void apply_defaults(const std::string& root, DatasetOptions& o);

 private:
  void read_info();
  void read_tasks();
  void read_episodes_v2(const std::vector<std::string>& columns, int64_t max_episodes);
  void read_episodes_v3(const std::vector<std::string>& columns, int64_t max_episodes);
  std::string feature_list() const;

  std::string root_;
  std::string config_key_;
  std::string version_;
  nlohmann::json info_;
  double fps_ = 0;
  int64_t chunks_size_ = 1000;
  std::string data_path_, video_path_;
  std::map<std::string, LeRobotFeature> features_;
  std::map<int64_t, std::string> tasks_;
  std::vector<LeRobotEpisode> episodes_;
  int video_threads_ = 1;
  uint64_t id_ = 0;  // keys this source's per-thread decoders
};

/// Python str.format for LeRobot's path templates: "{episode_chunk:03d}" -> "001". UserError naming `what` for a
/// field that `values` lacks or a format spec other than [0]Nd.
std::string expand_template(const std::string& pattern, const std::map<std::string, std::string>& strings,
                            const std::map<std::string, int64_t>& ints, const std::string& what);

}  // namespace pi0::data
