// pi0-plot: draws training curves from a metrics JSONL file to a PNG, without Python.
//   pi0-plot --metrics run/metrics.jsonl --out loss.png [--width 1000] [--height 700] [--keys loss,lr] [--log-y loss]
// One panel per key, step on the x axis. Without --keys: the loss on a log axis and the learning rate, and when the run
// held episodes out for validation (records {"step", "val_loss", "val_action_mse"} every train.val_interval steps)
// the validation loss drawn over the training loss in the same panel (one axis: over- or underfitting reads off the
// gap between the two lines) and a val_action_mse panel, log axis too; a mixture's per-dataset values
// ("val_loss/<asset id>", "val_action_mse/<asset id>") are further lines in those two panels, one colour per dataset.
// Flags, exit codes: pi0-plot --help.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/train/metrics.h"
#include "pi0/train/plot.h"

namespace {

int plot_main(int argc, char** argv) {
  std::string metrics, out;
  int width = 1000, height = 700;
  std::vector<std::string> keys = {"loss", "lr"}, log_keys = {"loss", "val_loss", "val_action_mse"};
  auto cli = pi0::app::make_parser("pi0-plot", "Draws training curves from a metrics JSONL file to a PNG.");
  cli->add_option("--metrics", metrics, "metrics.jsonl of a run")->required()->check(pi0::app::non_empty());
  cli->add_option("--out", out, "PNG to write")->required()->check(pi0::app::non_empty());
  cli->add_option("--width", width, "image width in pixels")->check(pi0::app::int_in(200, 10000));
  cli->add_option("--height", height, "image height in pixels")->check(pi0::app::int_in(200, 10000));
  auto* keys_flag =
      cli->add_option("--keys", keys,
                      "metrics to draw against 'step', one panel each, comma-separated ('lr' falls back to "
                      "'learning_rate'); when not given and the file has validation records, also val_loss drawn "
                      "over the loss in its panel and a val_action_mse panel after it, for a train.subtask run "
                      "ce_subtask and subtask_acc panels, and for a train.ki run ce_fast, flow_loss and fast_acc "
                      "panels")
          ->delimiter(',');
  cli->add_option("--log-y", log_keys,
                  "metrics drawn on a logarithmic axis when all their values are positive, comma-separated")
      ->delimiter(',');
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  keys.erase(std::remove(keys.begin(), keys.end(), std::string()), keys.end());
  if (keys.empty()) throw pi0::UserError("--keys must name at least one metric");

  const auto records = pi0::train::read_metrics(metrics);
  // (step, value) of every record holding `key` ('lr' also reads 'learning_rate').
  const auto read_key = [&](const std::string& key, std::vector<double>& x, std::vector<double>& y) {
    for (const auto& r : records) {
      if (!r.contains("step") || !r["step"].is_number()) continue;
      const nlohmann::json* v = nullptr;
      if (r.contains(key)) v = &r[key];
      else if (key == "lr" && r.contains("learning_rate")) v = &r["learning_rate"];
      if (v == nullptr) continue;
      x.push_back(r["step"].get<double>());
      y.push_back(v->is_number() ? v->get<double>() : NAN);  // null (NaN in JSON) breaks the line
    }
  };
  const auto in_file = [&](const std::string& key) {
    return std::any_of(records.begin(), records.end(), [&](const nlohmann::json& r) { return r.contains(key); });
  };
  // Validation records are separate lines of the same file; a run without a validation split has none.
  const bool default_keys = keys_flag->count() == 0;
  const bool val_over_loss = default_keys && in_file("val_loss");
  if (default_keys && in_file("val_action_mse")) keys.insert(keys.begin() + 1, "val_action_mse");
  // A knowledge-insulation run (train.ki): its loss parts, each in a panel of its own before the learning rate.
  if (default_keys && in_file("ce_fast")) keys.insert(keys.end() - 1, {"ce_fast", "flow_loss", "fast_acc"});
  // A subtask-prediction run (train.subtask): its cross-entropy and accuracy, likewise.
  if (default_keys && in_file("ce_subtask")) keys.insert(keys.end() - 1, {"ce_subtask", "subtask_acc"});

  const std::vector<pi0::train::Rgb> colors = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}};
  const pi0::train::Rgb val_color = {255, 127, 14};  // none of the panel colours
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
  const std::vector<pi0::train::Rgb> dataset_colors = {
      {23, 190, 207}, {188, 189, 34}, {227, 119, 194}, {140, 86, 75}, {127, 127, 127}, {0, 0, 0}};
  // val_loss over the loss panel, val_action_mse in its own: the datasets' lines join the aggregate's.
  const auto add_dataset_lines = [&](const std::string& metric, pi0::train::PlotSeries& panel) {
    for (size_t i = 0; default_keys && i < datasets.size(); ++i) {
      pi0::train::PlotLine line{metric + "/" + datasets[i], {}, {}, dataset_colors[i % dataset_colors.size()]};
      read_key(line.label, line.x, line.y);
      if (!line.x.empty()) panel.overlays.push_back(std::move(line));
    }
  };
  std::vector<pi0::train::PlotSeries> panels;
  for (size_t k = 0; k < keys.size(); ++k) {
    pi0::train::PlotSeries s;
    s.title = keys[k] == "lr" ? "learning rate" : keys[k];
    s.color = colors[k % colors.size()];
    s.log_y = std::find(log_keys.begin(), log_keys.end(), keys[k]) != log_keys.end();
    read_key(keys[k], s.x, s.y);
    if (s.x.empty()) std::cerr << "pi0-plot: warning: no records with '" << keys[k] << "' in " << metrics << "\n";
    if (val_over_loss && keys[k] == "loss") {
      pi0::train::PlotLine val{"val_loss", {}, {}, val_color};
      read_key("val_loss", val.x, val.y);
      s.overlays.push_back(std::move(val));
      add_dataset_lines("val_loss", s);
    }
    if (keys[k] == "val_action_mse") add_dataset_lines("val_action_mse", s);
    panels.push_back(std::move(s));
  }
  pi0::train::write_png(out, pi0::train::plot_panels(panels, width, height, "step"));
  std::cout << "wrote " << out << " (" << records.size() << " records)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-plot", [&] { return plot_main(argc, argv); });
}
