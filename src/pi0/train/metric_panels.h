// What pi0-plot draws from a run's metrics.jsonl records: which metrics get a panel, in which order, and which
// validation lines are drawn over which training panel (a held-out value reads as over- or underfitting only on
// the axis of its training counterpart).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/train/plot.h"

namespace pi0::train {

/// The panels when --keys is not given, for the metrics the records hold: loss, val_action_mse (a validation split),
/// the FAST metrics (train.ki: ce_fast, flow_loss, fast_acc; model.type pi0_fast: fast_acc; both fast_undecodable),
/// the subtask ones (ce_subtask, subtask_acc), then lr.
std::vector<std::string> default_panel_keys(const std::vector<nlohmann::json>& records);

/// The validation metric drawn over training metric `key`'s panel: val_loss over loss, val_ce_subtask over
/// ce_subtask, val_subtask_acc over subtask_acc, val_fast_undecodable (free-running decoding) over fast_undecodable
/// (teacher-forced); empty for the others.
std::string validation_overlay(const std::string& key);

struct MetricPanels {
  std::vector<PlotSeries> panels;
  std::vector<std::string> missing;  ///< keys no record holds (their panels are drawn empty)
};

/// One panel per key (each record's (step, value); 'lr' also reads 'learning_rate', a null value breaks the line),
/// log-y where `log_keys` names it. With `overlays` (pi0-plot without --keys), each panel's validation_overlay and,
/// for a mixture, its datasets' "val_loss/<asset id>" / "val_action_mse/<asset id>" lines, one colour per dataset.
MetricPanels metric_panels(const std::vector<nlohmann::json>& records, const std::vector<std::string>& keys,
                           const std::vector<std::string>& log_keys, bool overlays);

}  // namespace pi0::train
