#include "pi0/data/dataset.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/log_line.h"
#include "pi0/common/strings.h"
#include "pi0/data/aloha.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/jpeg.h"
#include "pi0/data/lerobot.h"
#include "pi0/model/observation.h"

namespace pi0::data {
namespace fs = pi0::posix_fs;

DatasetOptions DatasetOptions::resolved() const {
  DatasetOptions o = *this;
  if (o.format == "libero" || o.format == "robomimic") {
    o.format = "libero";
    if (o.cameras.empty()) o.cameras = {{"base_0_rgb", "agentview_rgb"}, {"left_wrist_0_rgb", "eye_in_hand_rgb"}};
    if (o.state_keys.empty()) o.state_keys = {"ee_states", "gripper_states"};
    if (o.action_key.empty()) o.action_key = "actions";
    if (o.flip_images == "auto") o.flip_images = "true";
    if (o.adapt_to_pi == "auto") o.adapt_to_pi = "false";
  } else if (o.format == "aloha") {
    if (o.cameras.empty())
      o.cameras = {{"base_0_rgb", "cam_high"}, {"left_wrist_0_rgb", "cam_left_wrist"},
                   {"right_wrist_0_rgb", "cam_right_wrist"}};
    if (o.state_keys.empty()) o.state_keys = {"qpos"};
    if (o.action_key.empty()) o.action_key = "action";
    if (o.flip_images == "auto") o.flip_images = "false";
    if (o.adapt_to_pi == "auto") o.adapt_to_pi = "true";
  } else if (o.format == "lerobot") {
    // Keys and adapt_to_pi "auto" depend on the dataset's features: LeRobotSource::apply_defaults at open.
    if (o.flip_images == "auto") o.flip_images = "false";  // openpi's LeRobot LIBERO frames are stored upright
  } else {
    throw UserError(o.config_key + ".format: got '" + o.format + "', expected 'libero', 'aloha' or 'lerobot'");
  }
  if (o.flip_images != "true" && o.flip_images != "false")
    throw UserError(o.config_key + ".flip_images: got '" + o.flip_images + "', expected auto, true or false");
  if (o.adapt_to_pi != "true" && o.adapt_to_pi != "false" && !(o.format == "lerobot" && o.adapt_to_pi == "auto"))
    throw UserError(o.config_key + ".adapt_to_pi: got '" + o.adapt_to_pi + "', expected auto, true or false");
  if (o.action_horizon < 1)
    throw UserError("dataset.action_horizon: got " + std::to_string(o.action_horizon) + ", expected >= 1");
  for (const auto& [slot, key] : o.cameras) {
    if (std::find(model::kCameraNames.begin(), model::kCameraNames.end(), slot) == model::kCameraNames.end())
      throw UserError(o.config_key + ".cameras: unknown camera slot '" + slot +
                      "', expected base_0_rgb, left_wrist_0_rgb or right_wrist_0_rgb");
  }
  if (o.paths.empty()) throw UserError(o.config_key + ".paths: empty, expected at least one file, directory or glob");
  return o;
}

std::vector<std::string> expand_paths(const std::vector<std::string>& paths, const std::string& key) {
  std::set<std::string> out;
  for (const auto& p : paths) {
    if (p.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      int rc = glob(p.c_str(), 0, nullptr, &g);
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) out.insert(g.gl_pathv[i]);
      globfree(&g);
      if (rc != 0) throw UserError(key + ": glob '" + p + "' matches no file" + relative_path_note(p));
    } else if (fs::is_directory(p)) {
      size_t before = out.size();
      for (const auto& e : fs::directory_iterator(p)) {
        auto ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".hdf5" || ext == ".h5")) out.insert(e.path().string());
      }
      if (out.size() == before) throw UserError(key + ": directory '" + p + "' holds no .hdf5 or .h5 file");
    } else {
      if (!fs::exists(p)) throw UserError(p + ": file not found (" + key + ")" + relative_path_note(p));
      out.insert(p);
    }
  }
  return {out.begin(), out.end()};
}

namespace {

/// train.subtask from an HDF5 episode (`obj`: its group, "/" for an ALOHA file): the per-frame integer dataset
/// obj/key indexing the JSON list of texts in obj's attribute `key` (or, LIBERO, data's), or obj's string attribute
/// `key` (one subtask for the whole episode). UserError naming train.subtask.key otherwise.
void read_hdf5_subtasks(const H5File& f, const std::string& obj, const std::string& key, EpisodeInfo& ep) {
  const std::string dset = (obj == "/" ? "" : obj + "/") + key;
  const std::string where = f.path() + ": train.subtask.key '" + key + "'";
  if (f.exists(dset) && !f.is_group(dset)) {
    const auto idx = f.read_doubles(dset);
    if (static_cast<int64_t>(idx.size()) != ep.length)
      throw UserError(where + ": dataset " + dset + " has " + std::to_string(idx.size()) + " values, expected one per "
                      "frame (" + std::to_string(ep.length) + ")");
    auto table = f.string_attr(obj, key);
    if (!table && obj.rfind("data/", 0) == 0) table = f.string_attr("data", key);
    if (!table)
      throw UserError(where + ": dataset " + dset + " indexes subtask texts, expected a JSON list of them in the "
                      "attribute '" + key + "' of " + obj + (obj.rfind("data/", 0) == 0 ? " or of data" : ""));
    try {
      ep.subtask_table = nlohmann::json::parse(*table).get<std::vector<std::string>>();
    } catch (const std::exception&) {
      throw UserError(where + ": attribute '" + key + "' is not a JSON list of strings");
    }
    for (const double v : idx) {
      if (v != std::floor(v) || v >= static_cast<double>(ep.subtask_table.size()))
        throw UserError(where + ": dataset " + dset + " holds " + std::to_string(v) + ", expected an integer below " +
                        std::to_string(ep.subtask_table.size()) + " (the texts in its attribute; < 0 = none)");
      ep.frame_subtasks.push_back(static_cast<int64_t>(v));
    }
    return;
  }
  if (auto text = f.string_attr(obj, key)) {
    ep.subtask = *text;
    return;
  }
  throw UserError(where + " is neither a dataset nor a string attribute of " + obj +
                  " (expected per-frame subtask indices or the episode's subtask text)");
}


/// "KITCHEN_SCENE3_turn_on_the_stove_demo.hdf5" -> "turn on the stove" (LIBERO's file names repeat the instruction).
std::string prompt_from_file_name(const std::string& path) {
  std::string stem = fs::path(path).stem().string();
  const std::string suffix = "_demo";
  if (stem.size() > suffix.size() && stem.compare(stem.size() - suffix.size(), suffix.size(), suffix) == 0)
    stem.resize(stem.size() - suffix.size());
  std::vector<std::string> words;
  size_t i = 0;
  while (i <= stem.size()) {
    size_t j = stem.find('_', i);
    if (j == std::string::npos) j = stem.size();
    words.push_back(stem.substr(i, j - i));
    i = j + 1;
  }
  // Drop a leading scene prefix of upper-case words (KITCHEN_SCENE3_, LIVING_ROOM_SCENE1_).
  size_t first = 0;
  while (first < words.size() &&
         std::all_of(words[first].begin(), words[first].end(), [](char c) { return !std::islower(c); }))
    ++first;
  std::string out;
  for (size_t k = first; k < words.size(); ++k) out += (out.empty() ? "" : " ") + words[k];
  return out.empty() ? stem : out;
}

// "demo_12" -> 12; -1 for anything else ("demo_1_old", "demo_", "mask"): robomimic's episode groups only.
int64_t demo_number(const std::string& name) {
  const size_t kPrefix = 5;  // "demo_"
  if (name.rfind("demo_", 0) != 0 || name.size() == kPrefix || name.size() > kPrefix + 15) return -1;
  int64_t n = 0;
  for (size_t i = kPrefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

// "a, b, c and 4 more": at most `max_items` quoted names.
std::string name_list(const std::vector<std::string>& names, size_t max_items = 10) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < max_items; ++i) out += (i ? ", " : "") + quote_value(names[i], 60);
  if (names.size() > max_items) out += " and " + std::to_string(names.size() - max_items) + " more";
  return out;
}

// Datasets that look like camera frames (uint8 (T,H,W,3), or (T,L) JPEG rows) directly inside `groups`, as paths.
std::vector<std::string> image_keys(const H5File& f, const std::vector<std::string>& groups) {
  std::vector<std::string> out;
  for (const auto& g : groups) {
    if (!f.is_group(g.empty() ? "/" : g)) continue;
    for (const auto& name : f.list(g.empty() ? "/" : g)) {
      const std::string path = g.empty() ? name : g + "/" + name;
      if (f.is_group(path)) continue;
      DatasetInfo di = f.info(path);
      const bool rgb = di.shape.size() == 4 && di.shape[3] == 3, jpeg_rows = di.shape.size() == 2;
      if (di.type_class == H5T_INTEGER && di.type_size == 1 && (rgb || jpeg_rows)) out.push_back(path);
    }
  }
  return out;
}

std::string first_existing(const H5File& f, const std::vector<std::string>& candidates) {
  for (const auto& c : candidates)
    if (f.exists(c)) return c;
  return "";
}

/// Reads a numeric (T,) or (T,D) array, validated, as [T,D] float32.
torch::Tensor read_low_dim(const H5File& f, const std::string& path, const std::string& role) {
  DatasetInfo di = f.info(path);
  if (di.type_class != H5T_FLOAT && di.type_class != H5T_INTEGER)
    throw UserError(f.path() + ": key " + path + " (" + role + ") has dtype " + di.dtype_name() +
                    ", expected a float array");
  if (di.shape.size() != 1 && di.shape.size() != 2)
    throw UserError(f.path() + ": key " + path + " (" + role + ") has rank " + std::to_string(di.shape.size()) +
                    ", expected (T,) or (T,D)");
  const int64_t T = di.shape[0];
  const int64_t D = di.shape.size() == 2 ? di.shape[1] : 1;
  if (T == 0) throw UserError(f.path() + ": key " + path + " (" + role + ") is an empty episode (0 steps)");
  std::vector<double> v = f.read_doubles(path);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]))
      throw UserError(f.path() + ": key " + path + " (" + role + ") holds " + (std::isnan(v[i]) ? "NaN" : "Inf") +
                      " at step " + std::to_string(i / D) + ", dim " + std::to_string(i % D) +
                      ", expected finite values");
  }
  return torch::from_blob(v.data(), {T, D}, torch::kFloat64).to(torch::kFloat32);
}

}  // namespace

RobotDataset::RobotDataset(DatasetOptions options) : options_(options.resolved()) {
  flip_ = options_.flip_images == "true";
  if (options_.format == "lerobot") {
    LeRobotSource::apply_defaults(options_.paths.front(), options_);
    file_paths_ = options_.paths;  // dataset roots
    for (int64_t i = 0; i < static_cast<int64_t>(file_paths_.size()); ++i) {
      if (options_.max_episodes > 0 && num_episodes() >= options_.max_episodes) break;
      open_lerobot(i);
    }
  } else {
    file_paths_ = expand_paths(options_.paths, options_.config_key + ".paths");
    for (int64_t i = 0; i < static_cast<int64_t>(file_paths_.size()); ++i) {
      if (options_.max_episodes > 0 && num_episodes() >= options_.max_episodes) break;
      open_file(i);
    }
  }
  if (episodes_.empty())
    throw UserError(options_.config_key + ".paths: no episode found in " + std::to_string(file_paths_.size()) + " file(s)");
  spdlog::info("dataset: {} file(s), {} episode(s), {} frames, state dim {}, action dim {}, horizon {}",
               file_paths_.size(), episodes_.size(), size_, state_dim_, action_dim_, options_.action_horizon);
}

RobotDataset::~RobotDataset() = default;

void RobotDataset::open_file(int64_t file_index) {
  const std::string& path = file_paths_[static_cast<size_t>(file_index)];
  files_.push_back(std::make_unique<H5File>(H5File::open(path)));
  const H5File& f = *files_.back();
  if (options_.format == "libero") {
    if (!f.is_group("data")) throw UserError(path + ": key data not found (expected a LIBERO/robomimic file with data/demo_N groups)");
    std::string file_prompt = options_.prompt;
    if (file_prompt.empty()) {
      if (auto info = f.string_attr("data", "problem_info")) {
        try {
          auto j = nlohmann::json::parse(*info);
          file_prompt = j.value("language_instruction", "");
        } catch (const std::exception&) {
          throw UserError(path + ": attribute data.problem_info is not valid JSON");
        }
        // LIBERO's own tools strip surrounding quotes.
        while (!file_prompt.empty() && file_prompt.front() == '"') file_prompt.erase(0, 1);
        while (!file_prompt.empty() && file_prompt.back() == '"') file_prompt.pop_back();
      }
      if (file_prompt.empty()) file_prompt = prompt_from_file_name(path);
    }
    std::vector<std::string> demos, skipped;
    for (auto& n : f.list("data")) (demo_number(n) >= 0 ? demos : skipped).push_back(n);
    if (!skipped.empty())
      spdlog::warn("{}: skipped {} link(s) under data/ not named demo_N (robomimic's episode groups): {}",
                   printable(path), skipped.size(), name_list(skipped));
    // HDF5 lists links by name (demo_10 before demo_2); robomimic sorts numerically, and so do we.
    std::sort(demos.begin(), demos.end(), [](const auto& a, const auto& b) { return demo_number(a) < demo_number(b); });
    if (demos.empty()) throw UserError(path + ": key data holds no demo_N group");
    for (const auto& d : demos) {
      if (options_.max_episodes > 0 && num_episodes() >= options_.max_episodes) break;
      add_episode(file_index, "data/" + d, file_prompt);
    }
  } else {
    if (options_.prompt.empty())
      throw UserError(path + ": ALOHA files store no language instruction; set " + options_.config_key + ".prompt");
    add_episode(file_index, "", options_.prompt);
  }
}

void RobotDataset::add_episode(int64_t file_index, const std::string& group, const std::string& file_prompt) {
  const H5File& f = *files_[static_cast<size_t>(file_index)];
  const bool libero = options_.format == "libero";
  const std::string root = group.empty() ? "" : group + "/";
  auto low_dim_candidates = [&](const std::string& k) -> std::vector<std::string> {
    if (!k.empty() && k[0] == '/') return {root + k.substr(1)};
    if (libero) return {root + "obs/" + k, root + k};
    return {"observations/" + k, k};
  };

  EpisodeInfo ep;
  ep.file = file_index;
  ep.group = group;
  ep.prompt = file_prompt;

  // Actions.
  auto action_cands = low_dim_candidates(options_.action_key);
  std::reverse(action_cands.begin(), action_cands.end());  // actions live beside obs/, not inside it
  std::string action_path = first_existing(f, action_cands);
  if (action_path.empty()) throw UserError(f.path() + ": key " + action_cands.front() + " not found (" + options_.config_key + ".action_key)");
  ep.actions = read_low_dim(f, action_path, "actions");
  ep.length = ep.actions.size(0);

  // State: concatenation of state_keys.
  std::vector<torch::Tensor> parts;
  for (const auto& k : options_.state_keys) {
    auto cands = low_dim_candidates(k);
    std::string p = first_existing(f, cands);
    if (p.empty()) throw UserError(f.path() + ": key " + cands.front() + " not found (" + options_.config_key + ".state_keys)");
    torch::Tensor x = read_low_dim(f, p, "state");
    if (x.size(0) != ep.length)
      throw UserError(f.path() + ": key " + p + " has " + std::to_string(x.size(0)) + " steps, expected " +
                      std::to_string(ep.length) + " like " + action_path);
    parts.push_back(x);
  }
  ep.state = torch::cat(parts, 1).contiguous();
  ep.actions = ep.actions.contiguous();
  if (options_.adapt_to_pi == "true") {
    ep.state = aloha_state_to_pi(ep.state, f.path() + ": " + root + " state (" + options_.config_key + ".adapt_to_pi)")
                   .contiguous();
    ep.actions = aloha_actions_to_pi(ep.actions, f.path() + ": key " + action_path + " (" + options_.config_key +
                                                     ".adapt_to_pi)")
                     .contiguous();
  }

  check_dims(ep, f.path() + ": " + root + " state", f.path() + ": key " + action_path);

  // Cameras: only shapes and dtypes are checked here.
  for (const auto& slot : model::kCameraNames) {
    std::string path;
    bool jpeg = false;
    auto it = options_.cameras.find(slot);
    if (it != options_.cameras.end() && !it->second.empty()) {
      const std::string& key = it->second;
      std::vector<std::string> cands;
      if (key[0] == '/') cands = {root + key.substr(1)};
      else if (libero) cands = {root + "obs/" + key, root + key};
      else cands = {"observations/images/" + key, key};
      path = first_existing(f, cands);
      if (path.empty()) {
        warn_once("dataset: camera key " + key + " not found",
                  f.path() + ": camera key " + cands.front() + " for slot " + slot +
                      " not found; that slot gets zero images with mask false");
      } else {
        DatasetInfo di = f.info(path);
        if (di.type_class != H5T_INTEGER || di.type_size != 1)
          throw UserError(f.path() + ": key " + path + " has dtype " + di.dtype_name() +
                          ", expected uint8 images (T,H,W,3)");
        if (di.shape.size() == 4) {
          if (di.shape[3] != 3)
            throw UserError(f.path() + ": key " + path + " has " + std::to_string(di.shape[3]) +
                            " channels, expected 3 (RGB images stored as (T,H,W,3))");
        } else if (di.shape.size() == 2) {
          jpeg = true;  // ALOHA 2 compressed layout: one zero-padded JPEG per row
        } else {
          throw UserError(f.path() + ": key " + path + " has rank " + std::to_string(di.shape.size()) +
                          ", expected (T,H,W,3) images or (T,L) JPEG rows");
        }
        if (di.shape[0] != ep.length)
          throw UserError(f.path() + ": key " + path + " has " + std::to_string(di.shape[0]) + " frames, expected " +
                          std::to_string(ep.length) + " like " + action_path);
      }
    }
    ep.camera_paths.push_back(path);
    ep.camera_jpeg.push_back(jpeg);
  }
  if (std::all_of(ep.camera_paths.begin(), ep.camera_paths.end(), [](const auto& p) { return p.empty(); })) {
    // Every slot would be a zero image with mask false: the model would train blind, never what was meant.
    std::string configured;
    for (const auto& [slot, key] : options_.cameras) configured += (configured.empty() ? "" : ", ") + slot + ": " + key;
    const auto found = libero ? image_keys(f, {root + "obs", group}) : image_keys(f, {"observations/images", ""});
    throw UserError(f.path() + ": none of the cameras in " + options_.config_key + ".cameras {" + printable(configured) +
                    "} exists in " +
                    (group.empty() ? std::string("the file") : group) + "; its image keys are " +
                    (found.empty() ? std::string("(none)") : name_list(found, 20)) +
                    "; expected " + options_.config_key + ".cameras to map slots to some of them");
  }

  if (!options_.subtask_key.empty()) read_hdf5_subtasks(f, group.empty() ? "/" : group, options_.subtask_key, ep);

  ep.first_index = size_;
  size_ += ep.length;
  episodes_.push_back(std::move(ep));
}

void RobotDataset::check_dims(const EpisodeInfo& ep, const std::string& state_what, const std::string& action_what) {
  if (state_dim_ < 0) state_dim_ = ep.state.size(1);
  if (action_dim_ < 0) action_dim_ = ep.actions.size(1);
  if (ep.state.size(1) != state_dim_)
    throw UserError(state_what + " has dim " + std::to_string(ep.state.size(1)) + ", expected " +
                    std::to_string(state_dim_) + " like the first episode (" + options_.config_key + ".state_keys)");
  if (ep.actions.size(1) != action_dim_)
    throw UserError(action_what + " has dim " + std::to_string(ep.actions.size(1)) + ", expected " +
                    std::to_string(action_dim_) + " like the first episode (" + options_.config_key + ".action_key)");
}

void RobotDataset::open_lerobot(int64_t source_index) {
  const std::string& root = file_paths_[static_cast<size_t>(source_index)];
  std::vector<std::string> columns = options_.state_keys;
  if (std::find(columns.begin(), columns.end(), options_.action_key) == columns.end())
    columns.push_back(options_.action_key);
  const std::string& sub = options_.subtask_key;
  if (!sub.empty() && std::find(columns.begin(), columns.end(), sub) == columns.end()) columns.push_back(sub);
  const int64_t remaining = options_.max_episodes > 0 ? options_.max_episodes - num_episodes() : 0;
  lerobot_.push_back(
      std::make_unique<LeRobotSource>(root, columns, remaining, /*video_threads=*/1, options_.config_key, sub));
  const LeRobotSource& src = *lerobot_.back();
  // Camera keys must be image or video features; a missing one is an error listing the features (unlike HDF5,
  // where per-file absence is tolerated, a LeRobot dataset declares its features once).
  std::vector<std::string> slot_keys;
  for (const auto& slot : model::kCameraNames) {
    auto it = options_.cameras.find(slot);
    std::string key = it == options_.cameras.end() ? "" : it->second;
    if (!key.empty()) {
      const LeRobotFeature& f = src.feature(key, options_.config_key + ".cameras." + slot);
      if (f.dtype != "image" && f.dtype != "video")
        throw UserError(root + "/meta/info.json: " + options_.config_key + ".cameras." + slot + ": feature '" + key +
                        "' has dtype " +
                        f.dtype + ", expected image or video");
    }
    slot_keys.push_back(key);
  }
  for (size_t e = 0; e < src.episodes().size(); ++e) {
    const LeRobotEpisode& le = src.episodes()[e];
    const std::string what = le.data_file + ": episode " + std::to_string(le.episode_index);
    EpisodeInfo ep;
    ep.file = source_index;
    ep.source_episode = static_cast<int64_t>(e);
    ep.length = le.length;
    if (ep.length == 0) throw UserError(what + " is empty (0 frames)");
    std::vector<torch::Tensor> parts;
    for (const auto& k : options_.state_keys) parts.push_back(le.columns.at(k));
    ep.state = torch::cat(parts, 1).to(torch::kFloat32).contiguous();
    ep.actions = le.columns.at(options_.action_key).to(torch::kFloat32).contiguous();
    for (const auto& [t, name] : {std::pair{&ep.state, std::string("state")}, std::pair{&ep.actions, options_.action_key}}) {
      if (!torch::isfinite(*t).all().item<bool>())
        throw UserError(what + ": column " + name + " holds NaN or Inf, expected finite values");
    }
    if (options_.adapt_to_pi == "true") {
      ep.state = aloha_state_to_pi(ep.state, what + " state (" + options_.config_key + ".adapt_to_pi)").contiguous();
      ep.actions = aloha_actions_to_pi(ep.actions, what + " " + options_.action_key + " (" + options_.config_key +
                                                       ".adapt_to_pi)")
                       .contiguous();
    }
    check_dims(ep, what + " state", what + " column " + options_.action_key);
    ep.camera_paths = slot_keys;
    ep.camera_jpeg.assign(slot_keys.size(), false);
    if (options_.prompt.empty()) ep.frame_tasks = le.task_index;
    else ep.prompt = options_.prompt;
    if (!sub.empty()) {
      // An index into meta/tasks, as task_index is (LeRobot keeps every text of a dataset there); < 0 = none.
      const auto col = le.columns.at(sub).reshape({-1}).to(torch::kFloat64).contiguous();
      const double* values = col.data_ptr<double>();
      for (int64_t i = 0; i < ep.length; ++i) {
        const double v = values[i];
        if (v >= 0) src.task(static_cast<int64_t>(v));  // checked now, not at the first sample that reads it
        ep.frame_subtasks.push_back(v < 0 ? -1 : static_cast<int64_t>(v));
      }
    }
    ep.first_index = size_;
    size_ += ep.length;
    episodes_.push_back(std::move(ep));
  }
}

std::pair<int64_t, int64_t> RobotDataset::locate(int64_t index) const {
  PI0_CHECK(index >= 0 && index < size_, "sample index ", index, " out of range [0, ", size_, ")");
  auto it = std::upper_bound(episodes_.begin(), episodes_.end(), index,
                             [](int64_t i, const EpisodeInfo& e) { return i < e.first_index; });
  const int64_t e = static_cast<int64_t>(it - episodes_.begin()) - 1;
  return {e, index - episodes_[static_cast<size_t>(e)].first_index};
}

torch::Tensor RobotDataset::action_chunk(int64_t e, int64_t t) const {
  const EpisodeInfo& ep = episode(e);
  const int64_t H = options_.action_horizon;
  // Indices t..t+H-1 clamped to the last step: the repeat-last-action rule.
  torch::Tensor idx = torch::clamp_max(torch::arange(t, t + H, torch::kLong), ep.length - 1);
  return ep.actions.index_select(0, idx);
}

torch::Tensor RobotDataset::read_frame(const EpisodeInfo& ep, size_t slot, int64_t t) const {
  if (options_.format == "lerobot") {
    torch::Tensor img = lerobot_source(ep.file).read_image(ep.source_episode, ep.camera_paths[slot], t);
    return flip_ ? img.flip({0, 1}).contiguous() : img;
  }
  const H5File& f = *files_[static_cast<size_t>(ep.file)];
  const std::string& path = ep.camera_paths[slot];
  torch::Tensor img;
  if (ep.camera_jpeg[slot]) {
    std::vector<uint8_t> row = f.read_bytes(path, t, 1);  // HDF5 lock held only for the read
    img = decode_jpeg(row.data(), row.size(), f.path() + ": key " + path + " frame " + std::to_string(t));
  } else {
    DatasetInfo di = f.info(path);
    std::vector<uint8_t> bytes = f.read_bytes(path, t, 1);
    img = torch::from_blob(bytes.data(), {di.shape[1], di.shape[2], 3}, torch::kUInt8).clone();
  }
  if (flip_) img = img.flip({0, 1}).contiguous();  // rotate 180°: img[::-1, ::-1]
  return img;
}

RawSample RobotDataset::get(int64_t index) const {
  auto [e, t] = locate(index);
  const EpisodeInfo& ep = episode(e);
  RawSample s;
  s.episode = e;
  s.frame = t;
  s.prompt = ep.frame_tasks.empty() ? ep.prompt : lerobot_source(ep.file).task(ep.frame_tasks[static_cast<size_t>(t)]);
  if (!ep.frame_subtasks.empty()) {
    const int64_t k = ep.frame_subtasks[static_cast<size_t>(t)];
    if (k >= 0)
      s.subtask = options_.format == "lerobot" ? lerobot_source(ep.file).task(k) : ep.subtask_table.at(static_cast<size_t>(k));
  } else {
    s.subtask = ep.subtask;
  }
  s.state = ep.state[t].clone();
  s.actions = action_chunk(e, t);
  s.valid_rows = std::min(options_.action_horizon, ep.length - t);
  for (size_t slot = 0; slot < model::kCameraNames.size(); ++slot) {
    if (ep.camera_paths[slot].empty()) {
      s.images.emplace_back();
      s.image_masks.push_back(false);
    } else {
      s.images.push_back(read_frame(ep, slot, t));
      s.image_masks.push_back(true);
    }
  }
  return s;
}

}  // namespace pi0::data
