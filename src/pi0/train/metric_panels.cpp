#include "pi0/train/metric_panels.h"

#include <algorithm>
#include <cmath>

namespace pi0::train {

namespace {

bool in_records(const std::vector<nlohmann::json>& records, const std::string& key) {
  return std::any_of(records.begin(), records.end(), [&](const nlohmann::json& r) { return r.contains(key); });
}

// (step, value) of every record holding `key` ('lr' also reads 'learning_rate').
void read_key(const std::vector<nlohmann::json>& records, const std::string& key, std::vector<double>& x,
              std::vector<double>& y) {
  for (const auto& r : records) {
    if (!r.contains("step") || !r["step"].is_number()) continue;
    const nlohmann::json* v = nullptr;
    if (r.contains(key)) v = &r[key];
    else if (key == "lr" && r.contains("learning_rate")) v = &r["learning_rate"];
    if (v == nullptr) continue;
    x.push_back(r["step"].get<double>());
    y.push_back(v->is_number() ? v->get<double>() : NAN);  // null (NaN in JSON) breaks the line
  }
}

}  // namespace

std::vector<std::string> default_panel_keys(const std::vector<nlohmann::json>& records) {
  const auto has = [&](const std::string& key) { return in_records(records, key); };
  std::vector<std::string> keys = {"loss"};
  // Validation records are separate lines of the same file; a run without a validation split has none.
  if (has("val_action_mse")) keys.push_back("val_action_mse");
  // Knowledge insulation (train.ki): its loss parts, each in a panel of its own; pi0-FAST: its accuracy.
  if (has("ce_fast")) keys.insert(keys.end(), {"ce_fast", "flow_loss"});
  if (has("fast_acc")) keys.push_back("fast_acc");
  if (has("fast_undecodable")) keys.push_back("fast_undecodable");
  // Subtask prediction (train.subtask): its cross-entropy and accuracy, the held-out values over them.
  if (has("ce_subtask")) keys.insert(keys.end(), {"ce_subtask", "subtask_acc"});
  keys.push_back("lr");
  return keys;
}

std::string validation_overlay(const std::string& key) {
  if (key == "loss") return "val_loss";
  if (key == "ce_subtask") return "val_ce_subtask";
  if (key == "subtask_acc") return "val_subtask_acc";
  if (key == "fast_undecodable") return "val_fast_undecodable";
  return "";
}

MetricPanels metric_panels(const std::vector<nlohmann::json>& records, const std::vector<std::string>& keys,
                           const std::vector<std::string>& log_keys, bool overlays) {
  const std::vector<Rgb> colors = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}};
  const Rgb val_color = {255, 127, 14};  // none of the panel colours
  // A mixture's datasets, in the order their keys first appear (their data.datasets order), each with a colour of
  // its own in both panels: none of the colours above.
  std::vector<std::string> datasets;
  for (const auto& r : records) {
    for (auto it = r.begin(); it != r.end(); ++it) {
      const std::string prefix = "val_loss/";
      if (it.key().rfind(prefix, 0) != 0) continue;
      const auto name = it.key().substr(prefix.size());
      if (std::find(datasets.begin(), datasets.end(), name) == datasets.end()) datasets.push_back(name);
    }
  }
  const std::vector<Rgb> dataset_colors = {{23, 190, 207}, {188, 189, 34}, {227, 119, 194},
                                           {140, 86, 75},  {127, 127, 127}, {0, 0, 0}};
  // val_loss over the loss panel, val_action_mse in its own: the datasets' lines join the aggregate's.
  const auto add_dataset_lines = [&](const std::string& metric, PlotSeries& panel) {
    for (size_t i = 0; i < datasets.size(); ++i) {
      PlotLine line{metric + "/" + datasets[i], {}, {}, dataset_colors[i % dataset_colors.size()]};
      read_key(records, line.label, line.x, line.y);
      if (!line.x.empty()) panel.overlays.push_back(std::move(line));
    }
  };
  MetricPanels out;
  for (size_t k = 0; k < keys.size(); ++k) {
    PlotSeries s;
    s.title = keys[k] == "lr" ? "learning rate" : keys[k];
    s.color = colors[k % colors.size()];
    s.log_y = std::find(log_keys.begin(), log_keys.end(), keys[k]) != log_keys.end();
    read_key(records, keys[k], s.x, s.y);
    if (s.x.empty()) out.missing.push_back(keys[k]);
    if (overlays) {
      if (const auto val = validation_overlay(keys[k]); !val.empty() && in_records(records, val)) {
        PlotLine line{val, {}, {}, val_color};
        read_key(records, val, line.x, line.y);
        s.overlays.push_back(std::move(line));
        if (keys[k] == "loss") add_dataset_lines("val_loss", s);
      }
      if (keys[k] == "val_action_mse") add_dataset_lines("val_action_mse", s);
    }
    out.panels.push_back(std::move(s));
  }
  return out;
}

}  // namespace pi0::train
