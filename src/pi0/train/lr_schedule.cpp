#include "pi0/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "pi0/common/check.h"

namespace pi0::train {
namespace {

void check_warmup(int64_t step, int64_t warmup_steps) {
  if (warmup_steps < 0)
    throw UserError("lr_warmup_steps must be >= 0 (got " + std::to_string(warmup_steps) + ")");
  PI0_CHECK(step >= 0, "lr schedule: step must be >= 0, got ", step);
}

// openpi's warmup (optax.linear_schedule from peak / (warmup + 1) to peak over warmup_steps), for step < warmup.
double openpi_warmup(int64_t step, int64_t warmup_steps, double peak_lr) {
  const double init = peak_lr / static_cast<double>(warmup_steps + 1);
  return init + (peak_lr - init) * static_cast<double>(step) / static_cast<double>(warmup_steps);
}

}  // namespace

double warmup_cosine_lr(int64_t step, int64_t warmup_steps, double peak_lr, int64_t decay_steps, double end_lr) {
  check_warmup(step, warmup_steps);
  if (decay_steps < 0) throw UserError("lr_decay_steps must be >= 0 (got " + std::to_string(decay_steps) + ")");
  if (step < warmup_steps) return openpi_warmup(step, warmup_steps, peak_lr);
  // max(1, ·): decay_steps == warmup_steps ends the cosine at once, as openpi's train_pytorch.py computes it (optax
  // itself refuses a zero-length decay).
  const double span = static_cast<double>(std::max<int64_t>(1, decay_steps - warmup_steps));
  const double p = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return end_lr + (peak_lr - end_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

double warmup_rsqrt_lr(int64_t step, int64_t warmup_steps, double peak_lr, double timescale) {
  check_warmup(step, warmup_steps);
  if (!(timescale > 0) || !std::isfinite(timescale))
    throw UserError("lr_timescale must be a finite number > 0 (got " + std::to_string(timescale) + ")");
  if (step < warmup_steps) return openpi_warmup(step, warmup_steps, peak_lr);
  const double s = static_cast<double>(step - warmup_steps);
  return peak_lr / std::sqrt((timescale + s) / timescale);
}

double warmup_constant_lr(int64_t step, int64_t warmup_steps, double peak_lr) {
  check_warmup(step, warmup_steps);
  if (step >= warmup_steps) return peak_lr;
  return peak_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
}

double scheduled_lr(const config::TrainConfig& t, int64_t step) {
  if (t.lr_schedule == "cosine") return warmup_cosine_lr(step, t.lr_warmup_steps, t.lr_peak, t.lr_decay_steps, t.lr_end);
  if (t.lr_schedule == "rsqrt") return warmup_rsqrt_lr(step, t.lr_warmup_steps, t.lr_peak, t.lr_timescale);
  if (t.lr_schedule == "constant") return warmup_constant_lr(step, t.lr_warmup_steps, t.lr_peak);
  throw UserError("train.lr_schedule must be cosine, rsqrt or constant (got '" + t.lr_schedule + "')");
}

}  // namespace pi0::train
