// Learning-rate schedules. warmup_cosine_lr mirrors optax.warmup_cosine_decay_schedule as openpi uses it
// (openpi-reference §8.2; replicated in openpi's train_pytorch.py).
#pragma once
#include <cstdint>

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

}  // namespace pi0::train
