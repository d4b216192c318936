// Robot demonstration datasets: HDF5 as LIBERO / robomimic (one file, many demos) and ALOHA (one file per episode),
// and LeRobot datasets v2.0/v2.1/v3.0 (parquet + PNG or MP4; data/lerobot.h). See docs/data.md and
// shared/docs/datasets-reference.md for the layouts. Every format yields the same EpisodeInfo and RawSample.
//
// A sample at global frame index i (episode e, step t) holds the camera frames and state at t and the action chunk
// [t, t+H). Past the end of an episode the LAST action is repeated (LeRobot clamps its delta_timestamps queries to
// the episode, which openpi trains on; a robot that has finished holds its final command).
//
// At open the index is built from dataset shapes only; state and action arrays (small) are read into memory and
// checked for NaN/Inf, images are never read until a sample needs them.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/config/config.h"

namespace pi0::data {

class H5File;
class LeRobotSource;

/// What to read and how: the config's data.dataset section (config::DatasetConfig: format, paths, cameras,
/// state_keys, action_key, prompt, adapt_to_pi, flip_images, each documented there) plus what does not come from
/// that section. Empty fields take the per-format defaults (see resolved()).
struct DatasetOptions : config::DatasetConfig {
  /// H: length of the action chunk per sample (model.action_horizon: 50 for the released pi0 models, 10 for
  /// pi05_libero).
  int64_t action_horizon = 50;
  /// Keep only the first N episodes (0 = all); for quick experiments.
  int64_t max_episodes = 0;
  /// The config section these options come from, named in messages about its keys: "data.dataset", or the mixture
  /// entry "data.datasets[1]" (data::dataset_options sets it); "dataset" when they come from no config.
  std::string config_key = "dataset";
  /// train.subtask.key: where each frame's subtask text is (RawSample::subtask); empty = no subtasks read.
  std::string subtask_key;

  /// A copy with every empty field replaced by the format default; throws UserError for an unknown format.
  DatasetOptions resolved() const;
};

/// One sample before any transform: uint8 HWC frames as stored (after the optional flip), native-dim state and
/// action chunk, prompt text.
struct RawSample {
  std::vector<torch::Tensor> images;  ///< per camera slot (model::kCameraNames order): [H,W,3] uint8, or undefined
  std::vector<bool> image_masks;      ///< per slot: true if the camera exists in the file
  torch::Tensor state;                ///< [S] float32
  torch::Tensor actions;              ///< [H,A] float32, rows past the episode end repeat the last action
  std::string prompt;
  std::string subtask;                ///< train.subtask: this frame's subtask text ("" = none)
  int64_t episode = 0;                ///< episode index in the dataset
  int64_t frame = 0;                  ///< t within the episode
  int64_t valid_rows = 0;             ///< rows of `actions` recorded (min(H, T − t)); the rest repeat the last one
};

/// One episode's location and its in-memory low-dim arrays.
struct EpisodeInfo {
  int64_t file = 0;        ///< index into RobotDataset::files()
  std::string group;       ///< "data/demo_3" (libero) or "" (aloha)
  int64_t length = 0;      ///< T
  int64_t first_index = 0; ///< global index of frame 0
  std::string prompt;
  std::vector<std::string> camera_paths;  ///< per slot: full dataset path, "" when absent
  std::vector<bool> camera_jpeg;          ///< per slot: rows are JPEG bytes (ALOHA 2 compressed layout)
  int64_t source_episode = 0;             ///< lerobot: index into LeRobotSource::episodes() of source `file`
  std::vector<int64_t> frame_tasks;       ///< lerobot: task_index per frame (prompt from the tasks file), else empty
  /// train.subtask: per frame an index into subtask_table (HDF5) or the tasks file (lerobot), < 0 = no subtask;
  /// empty with subtask_table empty: `subtask` for every frame.
  std::vector<int64_t> frame_subtasks;
  std::vector<std::string> subtask_table;
  std::string subtask;
  torch::Tensor state;                    ///< [T,S] float32
  torch::Tensor actions;                  ///< [T,A] float32
};

class RobotDataset {
 public:
  /// Opens every file and builds the index; throws UserError naming file and key for any problem.
  explicit RobotDataset(DatasetOptions options);
  ~RobotDataset();

  int64_t size() const { return size_; }  ///< number of frames = samples
  int64_t num_episodes() const { return static_cast<int64_t>(episodes_.size()); }
  int64_t state_dim() const { return state_dim_; }
  int64_t action_dim() const { return action_dim_; }
  int64_t action_horizon() const { return options_.action_horizon; }
  const DatasetOptions& options() const { return options_; }
  const EpisodeInfo& episode(int64_t e) const { return episodes_.at(static_cast<size_t>(e)); }
  const std::vector<std::string>& files() const { return file_paths_; }

  /// The LeRobot source of an episode's `file` (format lerobot only).
  const LeRobotSource& lerobot_source(int64_t file) const { return *lerobot_.at(static_cast<size_t>(file)); }

  /// Sample at global frame index `index` in [0, size()). Thread-safe.
  RawSample get(int64_t index) const;
  /// Action chunk [H,A] starting at frame t of episode e (repeat-last rule).
  torch::Tensor action_chunk(int64_t e, int64_t t) const;
  /// (episode, frame) of a global index.
  std::pair<int64_t, int64_t> locate(int64_t index) const;

 private:
  void open_file(int64_t file_index);
  void add_episode(int64_t file_index, const std::string& group, const std::string& file_prompt);
  void open_lerobot(int64_t source_index);
  /// Sets the state and action dims from the first episode and checks every later one against them.
  void check_dims(const EpisodeInfo& ep, const std::string& state_what, const std::string& action_what);
  torch::Tensor read_frame(const EpisodeInfo& ep, size_t slot, int64_t t) const;

  DatasetOptions options_;
  bool flip_ = false;
  std::vector<std::string> file_paths_;
  std::vector<std::unique_ptr<H5File>> files_;
  std::vector<std::unique_ptr<LeRobotSource>> lerobot_;  ///< format lerobot: one per dataset root
  std::vector<EpisodeInfo> episodes_;
  int64_t size_ = 0;
  int64_t state_dim_ = -1;
  int64_t action_dim_ = -1;
};

/// Expands files, directories and glob patterns into a sorted, de-duplicated list; UserError if one matches nothing.
std::vector<std::string> expand_paths(const std::vector<std::string>& paths, const std::string& key = "dataset.paths");

}  // namespace pi0::data
