#include "pi0/data/lerobot.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/dataset.h"
#include "pi0/data/parquet.h"
#include "pi0/data/png.h"
#include "pi0/data/video.h"

namespace pi0::data {
namespace fs = pi0::posix_fs;

int64_t LeRobotFeature::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string expand_template(const std::string& pattern, const std::map<std::string, std::string>& strings,
                            const std::map<std::string, int64_t>& ints, const std::string& what) {
  std::string out;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '{' && i + 1 < pattern.size() && pattern[i + 1] == '{') { out += '{'; i += 2; continue; }
    if (c == '}' && i + 1 < pattern.size() && pattern[i + 1] == '}') { out += '}'; i += 2; continue; }
    if (c != '{') { out += c; ++i; continue; }
    const size_t close = pattern.find('}', i);
    if (close == std::string::npos) throw UserError(what + ": unbalanced '{' in template '" + pattern + "'");
    const std::string field = pattern.substr(i + 1, close - i - 1);
    const size_t colon = field.find(':');
    const std::string name = field.substr(0, colon);
    const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    if (auto s = strings.find(name); s != strings.end() && spec.empty()) {
      out += s->second;
    } else if (auto v = ints.find(name); v != ints.end()) {
      std::string digits = std::to_string(v->second);
      if (!spec.empty()) {
        // Only the specs LeRobot writes: "d", "Nd", "0Nd".
        if (spec.back() != 'd' || !std::all_of(spec.begin(), spec.end() - 1, ::isdigit))
          throw UserError(what + ": unsupported format spec '{" + field + "}' in template '" + pattern +
                          "', expected {name}, {name:d} or {name:0Nd}");
        const size_t width = spec.size() > 1 ? std::stoul(spec.substr(0, spec.size() - 1)) : 0;
        const char pad = spec.size() > 1 && spec[0] == '0' ? '0' : ' ';
        if (digits.size() < width) digits = std::string(width - digits.size(), pad) + digits;
      }
      out += digits;
    } else {
      throw UserError(what + ": unknown field '{" + field + "}' in template '" + pattern + "'");
    }
    i = close + 1;
  }
  return out;
}

namespace {

nlohmann::json read_json(const std::string& path) {
  if (const auto problem = input_file_problem(path); !problem.empty() && problem != "file not found")
    throw UserError(path + ": " + problem);
  std::ifstream in(path);
  if (!in) throw UserError(path + ": file not found (a LeRobot dataset root holds meta/info.json)");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UserError(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  require_input_file(path);
  std::ifstream in(path);
  if (!in) throw UserError(path + ": file not found");
  std::vector<nlohmann::json> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const std::exception& e) {
      throw UserError(path + ": line " + std::to_string(n) + " is not valid JSON (" + e.what() + ")");
    }
  }
  return out;
}

template <typename T>
T json_field(const nlohmann::json& j, const std::string& key, const std::string& file, const std::string& expected) {
  if (!j.is_object() || !j.contains(key)) throw UserError(file + ": key " + key + " missing, expected " + expected);
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    throw UserError(file + ": key " + key + " is " + j.at(key).dump() + ", expected " + expected);
  }
}

std::atomic<uint64_t> g_next_source_id{1};

/// Per-thread open video decoders, keyed by (source id, file): one long-lived decoder per worker and file.
struct DecoderCache {
  std::map<std::pair<uint64_t, std::string>, std::unique_ptr<VideoDecoder>> decoders;
  std::map<std::pair<uint64_t, std::string>, uint64_t> last_use;
  uint64_t clock = 0;
  static constexpr size_t kMax = 32;  // open files per thread (LeRobot's VideoDecoderCache keeps up to 100)

  VideoDecoder& get(uint64_t id, const std::string& path, int threads) {
    const auto key = std::make_pair(id, path);
    last_use[key] = ++clock;
    auto it = decoders.find(key);
    if (it != decoders.end()) return *it->second;
    if (decoders.size() >= kMax) {
      auto oldest = std::min_element(last_use.begin(), last_use.end(),
                                     [&](const auto& a, const auto& b) {
                                       return decoders.count(a.first) && (!decoders.count(b.first) || a.second < b.second);
                                     });
      decoders.erase(oldest->first);
      last_use.erase(oldest);
      last_use[key] = clock;
    }
    return *decoders.emplace(key, std::make_unique<VideoDecoder>(path, threads)).first->second;
  }
};

}  // namespace

LeRobotSource::LeRobotSource(const std::string& root, const std::vector<std::string>& columns, int64_t max_episodes,
                             int video_threads, std::string config_key, const std::string& subtask_key)
    : root_(root), config_key_(std::move(config_key)), video_threads_(video_threads), id_(g_next_source_id++) {
  if (!parquet::available()) parquet::file_info("");  // throws the one-line "built without Arrow" error
  read_info();
  for (const auto& c : columns) {
    const bool subtask = !subtask_key.empty() && c == subtask_key;
    const std::string role =
        subtask ? "train.subtask.key" : config_key_ + ".state_keys / " + config_key_ + ".action_key";
    const LeRobotFeature& f = feature(c, role);
    if (f.dtype == "image" || f.dtype == "video" || f.dtype == "string" || f.dtype == "language")
      throw UserError(root_ + "/meta/info.json: feature '" + c + "' has dtype " + f.dtype + ", expected " +
                      (subtask ? "an integer column (an index into meta/tasks)" : "a numeric vector") + " for " + role);
    if (subtask && f.numel() != 1)
      throw UserError(root_ + "/meta/info.json: feature '" + c + "' has " + std::to_string(f.numel()) +
                      " values per frame, expected 1 (an index into meta/tasks) for train.subtask.key");
  }
  read_tasks();
  if (version_ == "v3.0") read_episodes_v3(columns, max_episodes);
  else read_episodes_v2(columns, max_episodes);
  if (episodes_.empty()) throw UserError(root_ + ": the dataset has no episodes");
}

LeRobotSource::~LeRobotSource() = default;

std::string LeRobotSource::feature_list() const {
  std::string out;
  for (const auto& [k, f] : features_) out += (out.empty() ? "" : ", ") + k + " (" + f.dtype + ")";
  return out;
}

const LeRobotFeature& LeRobotSource::feature(const std::string& key, const std::string& role) const {
  auto it = features_.find(key);
  if (it == features_.end())
    throw UserError(root_ + "/meta/info.json: " + role + ": '" + key + "' is not a feature of this dataset; it has: " +
                    feature_list());
  return it->second;
}

const std::string& LeRobotSource::task(int64_t task_index) const {
  auto it = tasks_.find(task_index);
  if (it == tasks_.end())
    throw UserError(root_ + "/meta: task_index " + std::to_string(task_index) + " is not in the tasks file (" +
                    std::to_string(tasks_.size()) + " tasks)");
  return it->second;
}

void LeRobotSource::read_info() {
  const std::string path = root_ + "/meta/info.json";
  if (!fs::is_directory(root_)) throw UserError(root_ + ": LeRobot dataset root not found (" + config_key_ + ".paths)");
  info_ = read_json(path);
  version_ = json_field<std::string>(info_, "codebase_version", path, "\"v2.0\", \"v2.1\" or \"v3.0\"");
  if (version_ != "v2.0" && version_ != "v2.1" && version_ != "v3.0")
    throw UserError(path + ": codebase_version is \"" + version_ + "\", expected v2.0, v2.1 or v3.0 (older LeRobot "
                    "datasets: convert them with LeRobot's converters first)");
  fps_ = json_field<double>(info_, "fps", path, "a number of frames per second");
  if (!(fps_ > 0)) throw UserError(path + ": key fps is " + std::to_string(fps_) + ", expected > 0");
  chunks_size_ = info_.contains("chunks_size") ? json_field<int64_t>(info_, "chunks_size", path, "an integer") : 1000;
  if (chunks_size_ < 1) throw UserError(path + ": key chunks_size is " + std::to_string(chunks_size_) + ", expected >= 1");
  data_path_ = json_field<std::string>(info_, "data_path", path, "a path template");
  if (info_.contains("video_path") && info_["video_path"].is_string()) video_path_ = info_["video_path"].get<std::string>();
  if (!info_.contains("features") || !info_["features"].is_object())
    throw UserError(path + ": key features missing or not an object");
  for (const auto& [k, v] : info_["features"].items()) {
    LeRobotFeature f;
    f.dtype = json_field<std::string>(v, "dtype", path + " features." + k, "a dtype string");
    f.shape = json_field<std::vector<int64_t>>(v, "shape", path + " features." + k, "a list of integers");
    features_[k] = f;
  }
}

void LeRobotSource::read_tasks() {
  if (version_ == "v3.0") {
    const std::string path = root_ + "/meta/tasks.parquet";
    const auto info = parquet::file_info(path);
    // Written by pandas: the task text is the index, stored as a column named "task".
    const std::string text_col = info.has("task") ? "task" : "__index_level_0__";
    const auto idx = parquet::read_numeric(path, "task_index");
    const auto text = parquet::read_strings(path, text_col);
    for (int64_t i = 0; i < idx.rows; ++i) tasks_[static_cast<int64_t>(idx.values[i])] = text.at(i);
  } else {
    const std::string path = root_ + "/meta/tasks.jsonl";
    for (const auto& j : read_jsonl(path))
      tasks_[json_field<int64_t>(j, "task_index", path, "an integer")] = json_field<std::string>(j, "task", path, "a string");
  }
}

namespace {

/// Slices the numeric `columns` of rows [first, first+len) of a file's columns into `ep`, checking widths.
void take_columns(LeRobotEpisode& ep, const std::vector<std::string>& columns,
                  const std::vector<parquet::NumericColumn>& cols, const std::map<std::string, LeRobotFeature>& feats) {
  for (size_t c = 0; c < columns.size(); ++c) {
    const auto& col = cols[c];
    const int64_t expected = feats.at(columns[c]).numel();
    if (col.width != expected)
      throw UserError(ep.data_file + ": column '" + columns[c] + "' has " + std::to_string(col.width) +
                      " values per row, expected " + std::to_string(expected) + " (its shape in meta/info.json)");
    torch::Tensor all = torch::from_blob(const_cast<double*>(col.values.data()), {col.rows, col.width}, torch::kFloat64);
    ep.columns[columns[c]] = all.narrow(0, ep.first_row, ep.length).clone();
  }
  const size_t n = columns.size();
  const auto& ts = cols[n].values;
  const auto& task = cols[n + 1].values;
  ep.timestamps.assign(ts.begin() + ep.first_row, ts.begin() + ep.first_row + ep.length);
  for (int64_t i = 0; i < ep.length; ++i) ep.task_index.push_back(static_cast<int64_t>(task[ep.first_row + i]));
}

}  // namespace

void LeRobotSource::read_episodes_v2(const std::vector<std::string>& columns, int64_t max_episodes) {
  const std::string meta = root_ + "/meta/episodes.jsonl";
  std::vector<std::pair<int64_t, int64_t>> eps;  // (episode_index, length)
  for (const auto& j : read_jsonl(meta))
    eps.emplace_back(json_field<int64_t>(j, "episode_index", meta, "an integer"),
                     json_field<int64_t>(j, "length", meta, "an integer"));
  std::sort(eps.begin(), eps.end());
  std::vector<std::string> video_keys;
  for (const auto& [k, f] : features_)
    if (f.dtype == "video") video_keys.push_back(k);
  std::vector<std::string> read_cols = columns;
  read_cols.push_back("timestamp");
  read_cols.push_back("task_index");
  for (const auto& [index, length] : eps) {
    if (max_episodes > 0 && static_cast<int64_t>(episodes_.size()) >= max_episodes) break;
    LeRobotEpisode ep;
    ep.episode_index = index;
    ep.length = length;
    const std::map<std::string, int64_t> ints = {{"episode_chunk", index / chunks_size_}, {"episode_index", index}};
    ep.data_file = root_ + "/" + expand_template(data_path_, {}, ints, root_ + "/meta/info.json data_path");
    const auto cols = parquet::read_numeric(ep.data_file, read_cols);
    if (cols[0].rows != length)
      throw UserError(ep.data_file + ": " + std::to_string(cols[0].rows) + " rows, expected " + std::to_string(length) +
                      " (episode " + std::to_string(index) + "'s length in " + meta + ")");
    take_columns(ep, columns, cols, features_);
    for (const auto& k : video_keys) {
      if (video_path_.empty()) throw UserError(root_ + "/meta/info.json: video feature '" + k + "' but no video_path");
      ep.video_files[k] = root_ + "/" + expand_template(video_path_, {{"video_key", k}}, ints,
                                                        root_ + "/meta/info.json video_path");
      ep.video_from_s[k] = 0.0;
    }
    episodes_.push_back(std::move(ep));
  }
}

void LeRobotSource::read_episodes_v3(const std::vector<std::string>& columns, int64_t max_episodes) {
  std::vector<std::string> meta_files;
  const fs::path meta_dir = fs::path(root_) / "meta" / "episodes";
  if (!fs::is_directory(meta_dir)) throw UserError(meta_dir.string() + ": folder not found (v3.0 episode metadata)");
  for (const auto& e : fs::recursive_directory_iterator(meta_dir))
    if (e.is_regular_file() && e.path().extension() == ".parquet") meta_files.push_back(e.path().string());
  std::sort(meta_files.begin(), meta_files.end());
  if (meta_files.empty()) throw UserError(meta_dir.string() + ": no parquet file (v3.0 episode metadata)");

  std::vector<std::string> video_keys;
  for (const auto& [k, f] : features_)
    if (f.dtype == "video") video_keys.push_back(k);
  std::vector<std::string> meta_cols = {"episode_index", "length", "data/chunk_index", "data/file_index",
                                        "dataset_from_index", "dataset_to_index"};
  for (const auto& k : video_keys)
    for (const char* s : {"/chunk_index", "/file_index", "/from_timestamp"}) meta_cols.push_back("videos/" + k + s);

  struct Row {
    int64_t index, length, data_chunk, data_file, from, to;
    std::vector<int64_t> video_chunk, video_file;
    std::vector<double> video_from;
  };
  std::vector<Row> rows;
  for (const auto& mf : meta_files) {
    const auto cols = parquet::read_numeric(mf, meta_cols);
    for (int64_t r = 0; r < cols[0].rows; ++r) {
      auto v = [&](size_t c) { return cols[c].values[static_cast<size_t>(r)]; };
      Row row{static_cast<int64_t>(v(0)), static_cast<int64_t>(v(1)), static_cast<int64_t>(v(2)),
              static_cast<int64_t>(v(3)), static_cast<int64_t>(v(4)), static_cast<int64_t>(v(5)), {}, {}, {}};
      for (size_t k = 0; k < video_keys.size(); ++k) {
        row.video_chunk.push_back(static_cast<int64_t>(v(6 + 3 * k)));
        row.video_file.push_back(static_cast<int64_t>(v(7 + 3 * k)));
        row.video_from.push_back(v(8 + 3 * k));
      }
      if (row.to - row.from != row.length)
        throw UserError(mf + ": episode " + std::to_string(row.index) + " has dataset_from_index " +
                        std::to_string(row.from) + " and dataset_to_index " + std::to_string(row.to) +
                        ", expected a range of its length " + std::to_string(row.length));
      rows.push_back(std::move(row));
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.index < b.index; });

  std::vector<std::string> read_cols = columns;
  read_cols.push_back("timestamp");
  read_cols.push_back("task_index");
  read_cols.push_back("index");
  read_cols.push_back("episode_index");
  std::map<std::string, std::vector<parquet::NumericColumn>> files;  // each data file read once
  for (const Row& row : rows) {
    if (max_episodes > 0 && static_cast<int64_t>(episodes_.size()) >= max_episodes) break;
    LeRobotEpisode ep;
    ep.episode_index = row.index;
    ep.length = row.length;
    ep.data_file = root_ + "/" + expand_template(data_path_, {}, {{"chunk_index", row.data_chunk}, {"file_index", row.data_file}},
                                                 root_ + "/meta/info.json data_path");
    auto it = files.find(ep.data_file);
    if (it == files.end()) it = files.emplace(ep.data_file, parquet::read_numeric(ep.data_file, read_cols)).first;
    const auto& cols = it->second;
    const auto& global = cols[columns.size() + 2];
    const auto& episode_col = cols[columns.size() + 3];
    // dataset_from_index is global over all data files; the file's first `index` value is where it starts.
    ep.first_row = global.rows > 0 ? row.from - static_cast<int64_t>(global.values[0]) : 0;
    if (ep.first_row < 0 || ep.first_row + ep.length > global.rows)
      throw UserError(ep.data_file + ": episode " + std::to_string(row.index) + " rows [" + std::to_string(row.from) +
                      ", " + std::to_string(row.to) + ") are not in this file (its index column starts at " +
                      (global.rows ? std::to_string(static_cast<int64_t>(global.values[0])) : std::string("-")) +
                      ", " + std::to_string(global.rows) + " rows); meta/episodes data/file_index is wrong");
    for (int64_t i = 0; i < ep.length; ++i) {
      if (static_cast<int64_t>(episode_col.values[ep.first_row + i]) != row.index)
        throw UserError(ep.data_file + ": row " + std::to_string(ep.first_row + i) + " has episode_index " +
                        std::to_string(static_cast<int64_t>(episode_col.values[ep.first_row + i])) + ", expected " +
                        std::to_string(row.index) + " (from dataset_from_index in meta/episodes)");
    }
    take_columns(ep, columns, cols, features_);
    for (size_t k = 0; k < video_keys.size(); ++k) {
      if (video_path_.empty()) throw UserError(root_ + "/meta/info.json: video feature '" + video_keys[k] + "' but no video_path");
      ep.video_files[video_keys[k]] =
          root_ + "/" + expand_template(video_path_, {{"video_key", video_keys[k]}},
                                        {{"chunk_index", row.video_chunk[k]}, {"file_index", row.video_file[k]}},
                                        root_ + "/meta/info.json video_path");
      ep.video_from_s[video_keys[k]] = row.video_from[k];
    }
    episodes_.push_back(std::move(ep));
  }
}

torch::Tensor LeRobotSource::read_image(int64_t e, const std::string& key, int64_t t) const {
  const LeRobotEpisode& ep = episodes_.at(static_cast<size_t>(e));
  const LeRobotFeature& f = features_.at(key);
  torch::Tensor img;
  if (f.dtype == "image") {
    const int64_t row = ep.first_row + t;
    const std::string bytes = parquet::read_image_bytes(ep.data_file, key, row);
    img = decode_png(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                     ep.data_file + ": column '" + key + "' row " + std::to_string(row));
  } else {
    thread_local DecoderCache cache;
    const std::string& file = ep.video_files.at(key);
    VideoDecoder& dec = cache.get(id_, file, video_threads_);
    // v3.0 files hold many episodes: the episode starts at from_timestamp inside the MP4.
    const double ts = ep.video_from_s.at(key) + ep.timestamps[static_cast<size_t>(t)];
    img = dec.frame_at(ts, kLeRobotToleranceS,
                       "episode " + std::to_string(ep.episode_index) + " frame " + std::to_string(t) + " (" + key + ")");
  }
  return img;
}

void LeRobotSource::apply_defaults(const std::string& root, DatasetOptions& o) {
  const std::string path = root + "/meta/info.json";
  if (!fs::is_directory(root)) throw UserError(root + ": LeRobot dataset root not found (" + o.config_key + ".paths)");
  const nlohmann::json info = read_json(path);
  if (!info.contains("features") || !info["features"].is_object())
    throw UserError(path + ": key features missing or not an object");
  const auto& feats = info["features"];
  auto has = [&](const std::string& k) { return feats.contains(k); };
  const std::string robot = info.contains("robot_type") && info["robot_type"].is_string() ? info["robot_type"].get<std::string>() : "";
  const bool aloha = robot.find("aloha") != std::string::npos || has("observation.images.cam_high");
  if (o.cameras.empty()) {
    if (has("image")) {  // openpi's LIBERO conversion (physical-intelligence/libero)
      o.cameras["base_0_rgb"] = "image";
      if (has("wrist_image")) o.cameras["left_wrist_0_rgb"] = "wrist_image";
    } else if (aloha) {  // openpi's ALOHA recipes: AlohaInputs' cam_high, cam_left_wrist, cam_right_wrist
      for (const auto& [slot, cam] : std::map<std::string, std::string>{{"base_0_rgb", "cam_high"},
                                                                        {"left_wrist_0_rgb", "cam_left_wrist"},
                                                                        {"right_wrist_0_rgb", "cam_right_wrist"}})
        if (has("observation.images." + cam)) o.cameras[slot] = "observation.images." + cam;
    } else if (has("observation.images.image")) {  // LeRobot's own LIBERO v3.0 naming
      o.cameras["base_0_rgb"] = "observation.images.image";
      for (const char* w : {"observation.images.wrist_image", "observation.images.image2"})
        if (has(w)) { o.cameras["left_wrist_0_rgb"] = w; break; }
    }
    if (o.cameras.empty())
      throw UserError(path + ": no default cameras for this dataset (its features are not openpi's LIBERO or ALOHA "
                      "names); set " + o.config_key + ".cameras, e.g. {base_0_rgb: observation.images.front}");
  }
  if (o.state_keys.empty()) o.state_keys = {has("state") ? "state" : "observation.state"};
  if (o.action_key.empty()) o.action_key = has("actions") ? "actions" : "action";
  if (o.adapt_to_pi == "auto") o.adapt_to_pi = aloha ? "true" : "false";
}

}  // namespace pi0::data
