// Small synthetic datasets in the real file layouts, for tests, benchmarks and the README example.
//
// LIBERO layout (one file, data/demo_N/...; same tree, dtypes and attributes as the released files, frames stored
// upside down). The task is learnable: a red blob marks a target on the agentview image (fixed per episode), a blue
// dot marks the end effector; actions[0:3] = clip(2·(target − ee_pos)), actions[3:6] = clip(−2·ee_ori), gripper
// +1 once within 0.08 of the target, else −1. So the arm action needs both the state and the image.
// Each frame's subtask (the reach's phase: "move to the red blob", then "close the gripper on the blob" once the
// gripper closes) is the index data/demo_N/subtask_index into the JSON list in data's attribute subtask_index
// (train.subtask.key: subtask_index).
#pragma once
#include <cstdint>
#include <string>

namespace pi0::data {

struct ExampleDataOptions {
  int64_t episodes = 4;
  int64_t steps = 40;       ///< T per episode
  uint64_t seed = 0;
  int64_t image_size = 64;  ///< stored frames are image_size × image_size
};

/// Writes `<dir>/reach_the_red_blob_demo.hdf5` in the LIBERO layout; returns its path. Creates `dir`.
std::string write_example_libero(const std::string& dir, const ExampleDataOptions& options = {});

/// Writes `<dir>/episode_<i>.hdf5` in the ALOHA layout (14-d float32 qpos/action, cameras cam_high,
/// cam_left_wrist, cam_right_wrist); `jpeg` = ALOHA 2 compressed rows (needs libjpeg). Returns the glob pattern.
std::string write_example_aloha(const std::string& dir, const ExampleDataOptions& options = {}, bool jpeg = false);

}  // namespace pi0::data
