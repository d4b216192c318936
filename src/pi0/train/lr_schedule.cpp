#include "pi0/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "pi0/common/check.h"

namespace pi0::train {

double warmup_cosine_lr(int64_t step, int64_t warmup_steps, double peak_lr, int64_t decay_steps, double end_lr) {
  if (warmup_steps < 0)
    throw UserError("lr_warmup_steps must be >= 0 (got " + std::to_string(warmup_steps) + ")");
  if (decay_steps < 0) throw UserError("lr_decay_steps must be >= 0 (got " + std::to_string(decay_steps) + ")");
  PI0_CHECK(step >= 0, "warmup_cosine_lr: step must be >= 0, got ", step);
  if (step < warmup_steps) {
    const double init = peak_lr / static_cast<double>(warmup_steps + 1);
    return init + (peak_lr - init) * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, decay_steps - warmup_steps));
  const double p = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return end_lr + (peak_lr - end_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace pi0::train
