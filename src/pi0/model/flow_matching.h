// The draws of flow-matching training (openpi-reference.md, "flow matching"): Gaussian noise and the time at which
// x_t = t·noise + (1 − t)·actions is taken. The one place time is sampled: the model's compute_loss (when no time is
// given) and the trainer (which draws from its own checkpointed generator) both call sample_flow_time, so the
// distribution cannot drift between them. Training-time real-time chunking extends it with per-token times.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <torch/torch.h>

namespace pi0::model {

/// Times t = Beta(1.5, 1)·0.999 + 0.001, in [0.001, 1): openpi's schedule, which leans towards t = 1 (pure
/// noise). Drawn by inversion: Beta(1.5, 1) has CDF t^1.5, so t = U^(1/1.5) for U uniform in [0, 1). `n` uniforms
/// are drawn (from `generator` when given — the trainer's, saved with checkpoints — else from the default generator
/// of `options`' device) and rows [first, first + count) of them are returned (count -1: all): a data-parallel
/// rank draws the global batch's times and keeps its slice, so its values do not depend on the world size. The
/// slice is taken before the transform, so each row's value is computed the same way whatever the world size.
torch::Tensor sample_flow_time(int64_t n, const torch::TensorOptions& options,
                               const std::optional<at::Generator>& generator = std::nullopt, int64_t first = 0,
                               int64_t count = -1);

/// Training-time real-time chunking's delays d ∈ {0, …, max_delay} (int64): "uniform" (LeRobot, OpenTau) or
/// "exp", P(d) ∝ exp(−exp_rate·d). Drawn by inversion from `n` float64 uniforms of `generator` (else the default
/// generator of `options`' device), rows [first, first + count) kept, as sample_flow_time.
torch::Tensor sample_rtc_delays(int64_t n, int64_t max_delay, const std::string& distribution, double exp_rate,
                                const torch::TensorOptions& options,
                                const std::optional<at::Generator>& generator = std::nullopt, int64_t first = 0,
                                int64_t count = -1);

/// Per-token times [B,H]: 0 (clean: the committed actions enter as recorded) for rows below each example's delay,
/// its flow time [B] after them.
torch::Tensor rtc_token_time(const torch::Tensor& time, const torch::Tensor& delays, int64_t horizon);

/// [B,H] float mask of the positions that count in the loss under those delays (rows ≥ d).
torch::Tensor rtc_loss_mask(const torch::Tensor& delays, int64_t horizon, const torch::TensorOptions& options);

/// train.loss_mask's [B,H,D] float mask (1 = counts) from a batch's facts (Batch::action_rows, action_dims, [B]
/// int64): `episode_end` keeps rows below each chunk's recorded rows (the rest repeat the episode's last action),
/// `action_padding` keeps the robot's own action dims (the rest are zero padding). Both off: all ones.
torch::Tensor action_loss_mask(const torch::Tensor& action_rows, const torch::Tensor& action_dims, int64_t horizon,
                               int64_t dim, bool episode_end, bool action_padding,
                               const torch::TensorOptions& options);

/// Mean of `elementwise` [B,H,D] over the elements `mask` keeps (any shape broadcastable to it, 0/1 values):
/// Σ(e·m) / Σ m (broadcast). An all-zero mask gives 0, not NaN.
torch::Tensor masked_mean(const torch::Tensor& elementwise, const torch::Tensor& mask);

}  // namespace pi0::model
