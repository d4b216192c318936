#include "pi0/data/example_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/jpeg.h"
#include "pi0/data/transforms.h"

namespace pi0::data {
namespace {

constexpr const char* kInstruction = "reach the red blob";
// Per-frame subtasks (train.subtask.key: subtask_index): the phase of the reach, which the image and the state show.
constexpr const char* kSubtasks[2] = {"move to the red blob", "close the gripper on the blob"};

double clip1(double x) { return std::clamp(x, -1.0, 1.0); }

void disk(uint8_t* img, int64_t S, double cx, double cy, double r, uint8_t R, uint8_t G, uint8_t B) {
  for (int64_t y = std::max<int64_t>(0, static_cast<int64_t>(cy - r)); y < std::min<int64_t>(S, static_cast<int64_t>(cy + r) + 1); ++y)
    for (int64_t x = std::max<int64_t>(0, static_cast<int64_t>(cx - r)); x < std::min<int64_t>(S, static_cast<int64_t>(cx + r) + 1); ++x)
      if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) {
        uint8_t* p = img + (y * S + x) * 3;
        p[0] = R; p[1] = G; p[2] = B;
      }
}

/// World xy in [-0.6, 0.6] -> pixel coordinates.
double to_px(double w, int64_t S) { return (w / 1.2 + 0.5) * static_cast<double>(S); }

}  // namespace

std::string write_example_libero(const std::string& dir, const ExampleDataOptions& o) {
  if (o.episodes < 1 || o.steps < 1 || o.image_size < 8)
    throw UserError("example data: episodes and steps must be >= 1 and image_size >= 8");
  create_directories_or_throw(dir, "--out");
  const std::string path = (std::filesystem::path(dir) / "reach_the_red_blob_demo.hdf5").string();
  H5File f = H5File::create(path);
  f.create_group("data");
  Rng rng(o.seed * 7919 + 17);
  const int64_t T = o.steps, S = o.image_size;
  for (int64_t e = 0; e < o.episodes; ++e) {
    const std::string g = "data/demo_" + std::to_string(e);
    f.create_group(g + "/obs");
    const double tx = rng.uniform(-0.4, 0.4), ty = rng.uniform(-0.4, 0.4), tz = 0.0;
    double pos[3] = {rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5), rng.uniform(0.2, 0.4)};
    double ori[3] = {rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3)};
    double grip = 0.04;
    std::vector<double> actions, ee_pos, ee_ori, ee_states, gripper_states, joint_states, robot_states, states;
    std::vector<uint8_t> agent(static_cast<size_t>(T * S * S * 3)), wrist(agent.size()), dones(T, 0), rewards(T, 0);
    std::vector<int64_t> subtask(static_cast<size_t>(T), 0);
    for (int64_t t = 0; t < T; ++t) {
      // Observation at t (before action t).
      for (int k = 0; k < 3; ++k) ee_pos.push_back(pos[k]);
      for (int k = 0; k < 3; ++k) ee_ori.push_back(ori[k]);
      for (int k = 0; k < 3; ++k) ee_states.push_back(pos[k]);
      for (int k = 0; k < 3; ++k) ee_states.push_back(ori[k]);
      gripper_states.push_back(grip);
      gripper_states.push_back(-grip);
      for (int k = 0; k < 7; ++k) joint_states.push_back(0.1 * k + 0.5 * pos[k % 3]);
      const double rs[9] = {grip, -grip, pos[0], pos[1], pos[2], 0.0, 0.0, 0.0, 1.0};
      robot_states.insert(robot_states.end(), rs, rs + 9);
      states.push_back(0.05 * static_cast<double>(t));  // [time, qpos..., qvel...]
      for (int k = 0; k < 9; ++k) states.push_back(rs[k]);
      for (int k = 0; k < 9; ++k) states.push_back(0.0);

      // Images, drawn upright, then stored rotated 180° like LIBERO's OpenGL-convention frames.
      std::vector<uint8_t> img(static_cast<size_t>(S * S * 3)), wimg(img.size());
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x) {
          uint8_t* p = &img[static_cast<size_t>((y * S + x) * 3)];
          p[0] = p[1] = p[2] = static_cast<uint8_t>(60 + 80 * y / S);  // floor gradient: top dark, bottom light
        }
      disk(img.data(), S, to_px(tx, S), to_px(ty, S), S / 10.0, 220, 30, 30);
      disk(img.data(), S, to_px(pos[0], S), to_px(pos[1], S), S / 20.0, 30, 60, 230);
      const double dist = std::sqrt((tx - pos[0]) * (tx - pos[0]) + (ty - pos[1]) * (ty - pos[1]) + (tz - pos[2]) * (tz - pos[2]));
      const uint8_t green = static_cast<uint8_t>(std::clamp(255.0 - 300.0 * dist, 0.0, 255.0));
      for (int64_t i = 0; i < S * S; ++i) {
        wimg[static_cast<size_t>(i * 3)] = 40;
        wimg[static_cast<size_t>(i * 3 + 1)] = green;
        wimg[static_cast<size_t>(i * 3 + 2)] = static_cast<uint8_t>(40 + (i % S) * 100 / S);
      }
      for (int64_t i = 0; i < S * S; ++i)
        for (int c = 0; c < 3; ++c) {
          const size_t dst = static_cast<size_t>((t * S * S + (S * S - 1 - i)) * 3 + c);
          agent[dst] = img[static_cast<size_t>(i * 3 + c)];
          wrist[dst] = wimg[static_cast<size_t>(i * 3 + c)];
        }

      // Expert action and dynamics.
      const double a[7] = {clip1(2.0 * (tx - pos[0])), clip1(2.0 * (ty - pos[1])), clip1(2.0 * (tz - pos[2])),
                           clip1(-2.0 * ori[0]), clip1(-2.0 * ori[1]), clip1(-2.0 * ori[2]),
                           dist < 0.08 ? 1.0 : -1.0};
      subtask[static_cast<size_t>(t)] = dist < 0.08 ? 1 : 0;
      actions.insert(actions.end(), a, a + 7);
      for (int k = 0; k < 3; ++k) pos[k] += 0.1 * a[k] + rng.uniform(-0.002, 0.002);
      for (int k = 0; k < 3; ++k) ori[k] += 0.1 * a[3 + k];
      grip = a[6] > 0 ? std::max(0.0, grip - 0.01) : std::min(0.04, grip + 0.01);
    }
    dones[static_cast<size_t>(T - 1)] = rewards[static_cast<size_t>(T - 1)] = 1;
    f.write(g + "/actions", {T, 7}, H5T_NATIVE_DOUBLE, actions.data());
    f.write(g + "/dones", {T}, H5T_NATIVE_UINT8, dones.data());
    f.write(g + "/rewards", {T}, H5T_NATIVE_UINT8, rewards.data());
    f.write(g + "/subtask_index", {T}, H5T_NATIVE_INT64, subtask.data());
    f.write(g + "/states", {T, 19}, H5T_NATIVE_DOUBLE, states.data());
    f.write(g + "/robot_states", {T, 9}, H5T_NATIVE_DOUBLE, robot_states.data());
    f.write(g + "/obs/agentview_rgb", {T, S, S, 3}, H5T_NATIVE_UINT8, agent.data());
    f.write(g + "/obs/eye_in_hand_rgb", {T, S, S, 3}, H5T_NATIVE_UINT8, wrist.data());
    f.write(g + "/obs/ee_pos", {T, 3}, H5T_NATIVE_DOUBLE, ee_pos.data());
    f.write(g + "/obs/ee_ori", {T, 3}, H5T_NATIVE_DOUBLE, ee_ori.data());
    f.write(g + "/obs/ee_states", {T, 6}, H5T_NATIVE_DOUBLE, ee_states.data());
    f.write(g + "/obs/gripper_states", {T, 2}, H5T_NATIVE_DOUBLE, gripper_states.data());
    f.write(g + "/obs/joint_states", {T, 7}, H5T_NATIVE_DOUBLE, joint_states.data());
    f.write_int64_attr(g, "num_samples", T);
    f.write_string_attr(g, "model_file", "<mujoco model=\"example\"/>");
    f.write_doubles_attr(g, "init_state", std::vector<double>(states.begin(), states.begin() + 19));
  }
  nlohmann::json problem = {{"problem_name", "libero_tabletop_manipulation"}, {"domain_name", "robosuite"},
                            {"language_instruction", kInstruction}};
  nlohmann::json env_args = {{"type", 1}, {"env_name", "Libero_Tabletop_Manipulation"},
                             {"problem_name", "libero_tabletop_manipulation"},
                             {"bddl_file", "example/reach_the_red_blob.bddl"},
                             {"env_kwargs", {{"control_freq", 20}, {"camera_heights", S}, {"camera_widths", S},
                                             {"camera_names", {"robot0_eye_in_hand", "agentview"}}}}};
  f.write_string_attr("data", "bddl_file_name", "example/reach_the_red_blob.bddl");
  f.write_string_attr("data", "env_args", env_args.dump());
  f.write_string_attr("data", "env_name", "Libero_Tabletop_Manipulation");
  f.write_string_attr("data", "macros_image_convention", "opengl");
  f.write_int64_attr("data", "num_demos", o.episodes);
  f.write_string_attr("data", "problem_info", problem.dump());
  f.write_string_attr("data", "tag", "libero-v1");
  f.write_string_attr("data", "subtask_index", nlohmann::json(std::vector<std::string>(kSubtasks, kSubtasks + 2)).dump());
  f.write_int64_attr("data", "total", o.episodes * T);
  return path;
}

std::string write_example_aloha(const std::string& dir, const ExampleDataOptions& o, bool jpeg) {
  create_directories_or_throw(dir, "--out");
  Rng rng(o.seed * 104729 + 3);
  const int64_t T = o.steps, S = o.image_size;
  const char* cams[3] = {"cam_high", "cam_left_wrist", "cam_right_wrist"};
  for (int64_t e = 0; e < o.episodes; ++e) {
    const std::string path = (std::filesystem::path(dir) / ("episode_" + std::to_string(e) + ".hdf5")).string();
    H5File f = H5File::create(path);
    f.write_bool_attr("/", "sim", true);
    std::vector<float> qpos(static_cast<size_t>(T * 14)), qvel(qpos.size()), action(qpos.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < 14; ++d) {
        const size_t i = static_cast<size_t>(t * 14 + d);
        qpos[i] = static_cast<float>(std::sin(0.1 * t + d + e) * 0.5);
        action[i] = static_cast<float>(std::sin(0.1 * (t + 1) + d + e) * 0.5 + rng.uniform(-0.01, 0.01));
      }
    f.write("observations/qpos", {T, 14}, H5T_NATIVE_FLOAT, qpos.data());
    f.write("observations/qvel", {T, 14}, H5T_NATIVE_FLOAT, qvel.data());
    f.write("action", {T, 14}, H5T_NATIVE_FLOAT, action.data());
    std::vector<std::vector<std::vector<uint8_t>>> encoded(3);
    int64_t max_len = 0;
    for (int c = 0; c < 3; ++c) {
      torch::Tensor frames = torch::empty({T, S, S, 3}, torch::kUInt8);
      for (int64_t t = 0; t < T; ++t) frames[t].fill_(static_cast<int64_t>((t * 7 + c * 60 + e * 13) % 256));
      if (!jpeg) {
        f.write(std::string("observations/images/") + cams[c], {T, S, S, 3}, H5T_NATIVE_UINT8, frames.data_ptr<uint8_t>());
      } else {
        for (int64_t t = 0; t < T; ++t) {
          encoded[static_cast<size_t>(c)].push_back(encode_jpeg(frames[t], 50));
          max_len = std::max<int64_t>(max_len, static_cast<int64_t>(encoded[static_cast<size_t>(c)].back().size()));
        }
      }
    }
    if (jpeg) {
      std::vector<float> lens;
      for (int c = 0; c < 3; ++c) {
        std::vector<uint8_t> rows(static_cast<size_t>(T * max_len), 0);
        for (int64_t t = 0; t < T; ++t) {
          const auto& enc = encoded[static_cast<size_t>(c)][static_cast<size_t>(t)];
          std::copy(enc.begin(), enc.end(), rows.begin() + t * max_len);
          lens.push_back(static_cast<float>(enc.size()));
        }
        f.write(std::string("observations/images/") + cams[c], {T, max_len}, H5T_NATIVE_UINT8, rows.data());
      }
      f.write("compress_len", {3, T}, H5T_NATIVE_FLOAT, lens.data());
      f.write_bool_attr("/", "compress", true);
    }
  }
  return (std::filesystem::path(dir) / "episode_*.hdf5").string();
}

}  // namespace pi0::data
