// Learning-rate schedules by name (train.lr_schedule): cosine and rsqrt are openpi's CosineDecaySchedule and
// RsqrtDecaySchedule (src/openpi/training/optimizer.py; openpi-reference §8.2), constant is LeRobot's
// constant-with-warmup (diffusers' get_constant_schedule_with_warmup, which LeRobot's DiffuserSchedulerConfig builds).
// All are evaluated in double at the 0-based update index; tests/unit/train/test_lr_schedule.cpp checks cosine and
// rsqrt at every step against a table made by openpi's own code (tests/data/lr_schedules.py).
#pragma once
#include <cstdint>

#include "pi0/config/config.h"

namespace pi0::train {

/// LR for the 0-based update index `step`:
///   init = peak_lr / (warmup_steps + 1)
///   step <  warmup_steps: init + (peak_lr − init) · step / warmup_steps          (linear warmup)
///   step >= warmup_steps: p = min(1, (step − warmup_steps) / max(1, decay_steps − warmup_steps))
///                         end_lr + (peak_lr − end_lr) · 0.5 · (1 + cos(π p))        (cosine, then constant)
/// NOTE: decay_steps counts from step 0 (it includes the warmup), as in optax.
/// Example: (0, 1000, 2.5e-5, 30000, 2.5e-6) → 2.4975e-8; (1000, ...) → 2.5e-5; (≥30000, ...) → 2.5e-6.
/// Throws UserError for warmup_steps < 0, decay_steps < 0 or step < 0.
double warmup_cosine_lr(int64_t step, int64_t warmup_steps, double peak_lr, int64_t decay_steps, double end_lr);

/// openpi's RsqrtDecaySchedule: the same linear warmup from peak_lr / (warmup_steps + 1), then
///   peak_lr / sqrt((timescale + s) / timescale),   s = step − warmup_steps
/// (optax.join_schedules restarts the count at the boundary, so the decay starts at peak_lr).
/// Example: (1000 + 30000, 1000, 5e-5, 1e4) → 5e-5 / 2 = 2.5e-5. Throws UserError for warmup_steps < 0 or
/// timescale <= 0.
double warmup_rsqrt_lr(int64_t step, int64_t warmup_steps, double peak_lr, double timescale);

/// LeRobot's constant-with-warmup: peak_lr · step / max(1, warmup_steps) while step < warmup_steps (0 at step 0, as
/// there), then peak_lr. Throws UserError for warmup_steps < 0.
double warmup_constant_lr(int64_t step, int64_t warmup_steps, double peak_lr);

/// The LR of update `step` under train.lr_schedule with its keys (lr_warmup_steps, lr_peak; cosine: lr_decay_steps,
/// lr_end; rsqrt: lr_timescale). UserError naming train.lr_schedule for a name it does not know.
double scheduled_lr(const config::TrainConfig& t, int64_t step);

}  // namespace pi0::train
