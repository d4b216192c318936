// pi0-plot: draws training curves from a metrics JSONL file to a PNG, without Python.
//   pi0-plot --metrics run/metrics.jsonl --out loss.png [--width 1000] [--height 700] [--keys loss,lr] [--log-y loss]
// One panel per key, step on the x axis. Without --keys: the loss on a log axis, the learning rate and what the run
// recorded besides (validation, FAST and subtask metrics), each held-out value drawn over its training counterpart in
// the same panel (one axis: over- or underfitting reads off the gap between the two lines); a mixture's per-dataset
// values ("val_loss/<asset id>", "val_action_mse/<asset id>") are further lines, one colour per dataset. The choice:
// train/metric_panels.h.
// Flags, exit codes: pi0-plot --help.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/train/metric_panels.h"
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
                      "'learning_rate'); when not given: loss and lr, and what the file holds of val_action_mse, "
                      "ce_fast, flow_loss, fast_acc, fast_undecodable, ce_subtask and subtask_acc (validation "
                      "values drawn over their training panel: val_loss over loss, val_ce_subtask over ce_subtask, "
                      "val_subtask_acc over subtask_acc, val_fast_undecodable over fast_undecodable)")
          ->delimiter(',');
  cli->add_option("--log-y", log_keys,
                  "metrics drawn on a logarithmic axis when all their values are positive, comma-separated")
      ->delimiter(',');
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  keys.erase(std::remove(keys.begin(), keys.end(), std::string()), keys.end());
  if (keys.empty()) throw pi0::UserError("--keys must name at least one metric");

  const auto records = pi0::train::read_metrics(metrics);
  const bool default_keys = keys_flag->count() == 0;
  if (default_keys) keys = pi0::train::default_panel_keys(records);
  const auto chosen = pi0::train::metric_panels(records, keys, log_keys, /*overlays=*/default_keys);
  for (const auto& key : chosen.missing)
    std::cerr << "pi0-plot: warning: no records with '" << key << "' in " << metrics << "\n";
  const auto& panels = chosen.panels;
  pi0::train::write_png(out, pi0::train::plot_panels(panels, width, height, "step"));
  std::cout << "wrote " << out << " (" << records.size() << " records)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-plot", [&] { return plot_main(argc, argv); });
}
