// The memory plan of pi0-train, from shapes alone (nothing allocated; `pi0-train --print-params`): the parameter
// breakdown under the freeze preset and precision, one rank's persistent state, activations and peak
// (MemoryPlan), and its resident peak for comparison with the peak RSS; and the report --print-params prints
// (format_memory_report, memory_report_json).
//
// Per-rank memory of data-parallel training under dist.shard (ZeRO-1/2), planned from shapes alone so a user can
// size a job without launching it (`pi0-train --print-params --world-size N`). The shares come from the same
// distributed::ShardLayout the trainer builds, over the trainable parameters of model::parameter_layout() in
// registration order with their storage element sizes, so the plan names the bytes the largest rank will hold.
//
// What each rank holds (docs/distributed.md, "Sharding"):
//   weights, bf16 cast cache     replicated: every rank runs the whole forward and backward
//   gradients                    all trainable gradients (none, optimizer), or the owned share (gradients)
//   reduction buffers            none kept: with none / optimizer the gradients become views of GradReducer's
//                                all-reduce buckets (a bucket's worth exists twice while it is packed)
//   AdamW moments                all (none), or the share: 2 per element in the parameter's dtype
//   EMA                          all (none), or the share: float32, 1 per element
// With dist.shard=gradients, gradients not owned by the rank exist only during backward, while their reductions are
// in flight: at most the reduction window (2 × dist.bucket_size_mb) plus the gradient just produced, which is whole
// until its pieces have been sent. With none / optimizer at world > 1, one bucket (or the largest parameter) is in
// flight twice while it is packed. Those are backward transients (in the peak), not state kept between steps.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/config/config.h"
#include "pi0/model/activation_memory.h"
#include "pi0/model/param_layout.h"
#include "pi0/train/placement.h"

namespace pi0::train {

/// Trainable-parameter breakdown of the configured model computed from shapes only (full-size models are never
/// allocated): breakdown(make_placement(cfg)), the placement the trainer builds.
ParamBreakdown planned_breakdown(const config::Config& cfg);

/// Planned memory of one training rank: the persistent state of planned_breakdown (weights, AdamW, EMA, cast
/// cache) and, during the step, the activations of one micro-batch (batch_size / (world size ·
/// grad_accum_steps)) and the gradients. Gradients exist only from backward to the optimizer step (zero_grad
/// frees them), and backward frees activations as it creates gradients, so the step holds the larger of the two
/// (see model/activation_memory.h), not their sum. peak_bytes() is what the tensor allocator holds at the peak;
/// the process's resident memory (peak RSS) adds the runtime and the allocator's slack: resident_peak_bytes().
struct MemoryPlan {
  /// Resident memory of pi0-train beyond its tensors and the allocator slack: shared libraries' pages, thread
  /// stacks, the BLAS's buffers, LibTorch's own allocations, the dataset index and the tokenizer. Calibrated on a
  /// training run of a model of almost no size (the calibration and its checks at full size: docs/benchmarks.md,
  /// "Full-size start-up, memory and checkpoints").
  static constexpr int64_t kRuntimeFloorBytes = 248ll << 20;

  ParamBreakdown params;
  model::ActivationMemory activations;
  model::CheckpointedLayers checkpointed;  ///< the layers recomputed in backward that `activations` assumes
  int64_t micro_batch = 0;
  int64_t num_cameras = 0;
  /// kRuntimeFloorBytes plus the data loader's batches beyond the one-sample batches of the floor: (data.prefetch
  /// queued + one per worker being built) · (per-rank batch − 1) float32 images (cameras · 3 · image_size² · 4 B).
  int64_t runtime_bytes = 0;
  /// Freed memory glibc keeps resident at the peak: one activation working set (activations.peak()), because
  /// glibc's mmap threshold rises to the largest block freed and backward allocates while the forward's freed
  /// blocks are still on its free lists (measurements, and why glibc's default threshold stays:
  /// docs/benchmarks.md, "Full-size start-up, memory and checkpoints").
  int64_t allocator_slack_bytes = 0;
  /// train.offload=optimizer: the gradients on their way from the device to the host accumulation (which is kept,
  /// part of params.total.memory_bytes()): RankMemory::in_flight_bytes.
  int64_t offload_in_flight_bytes = 0;
  int64_t peak_bytes() const {
    if (params.offload) {
      return params.total.memory_bytes() +
             std::max(activations.saved, offload_in_flight_bytes + activations.last_layer) + activations.transient;
    }
    const int64_t grads = params.total.grad_bytes;
    return params.total.memory_bytes() - grads +
           std::max(activations.saved, grads + activations.last_layer) + activations.transient;
  }
  int64_t resident_peak_bytes() const { return peak_bytes() + runtime_bytes + allocator_slack_bytes; }
};
/// Planned for `world_size` ranks; UserError when the global batch does not split evenly (as training would).
/// `checkpointed`: the layers gradient checkpointing recomputes; by default planned_checkpointing(cfg).
MemoryPlan plan_memory(const config::Config& cfg, int64_t world_size = 1,
                       std::optional<model::CheckpointedLayers> checkpointed = std::nullopt);

/// train.gradient_checkpointing as written: every layer (true) or none (false). auto counts as none, as
/// train.offload=auto does: there is no GPU to plan against here; the trainer decides it at start-up
/// (choose_checkpointed_layers).
model::CheckpointedLayers planned_checkpointing(const config::Config& cfg);

/// The parts of the model backward reaches under `table`'s trainable flags (model/activation_memory.h): SigLIP when a
/// SigLIP parameter trains; the prefix expert's tokens when anything of the vision, embedding or language components
/// (LoRA factors by the layer they adapt) trains. What the activation plan counts.
model::GradientReach gradient_reach(const PlacementTable& table);
/// The same for a config's placement (make_placement(cfg)).
model::GradientReach gradient_reach(const config::Config& cfg);

/// For the log and the report: "on" (every layer), "off", or "12 of 27 vision, 10 of 18 language layers".
std::string describe_checkpointing(const config::Config& cfg, const model::CheckpointedLayers& layers);


/// Memory of one data-parallel rank, in bytes: the rank with the largest share (the one a GPU must fit).
struct RankMemory {
  int64_t world_size = 1;
  std::string shard = "none";   ///< the mode in effect: dist.shard, or "none" at world size 1 (nothing to split)
  int64_t rank = 0;             ///< which rank these figures are for (the largest share)
  int64_t trainable = 0;        ///< trainable elements of the whole model
  int64_t share_elements = 0;   ///< trainable elements whose optimizer state this rank keeps (all when unsharded)
  int64_t weight_bytes = 0;     ///< every parameter in its storage dtype (replicated)
  int64_t cast_bytes = 0;       ///< bf16 copies of trainable layer weights (replicated; 0 unless bf16-mixed)
  int64_t grad_bytes = 0;       ///< gradients kept until the optimizer step
  int64_t reducer_bytes = 0;    ///< reduction buffers kept between steps (none: gradients are views of them)
  int64_t optimizer_bytes = 0;  ///< AdamW exp_avg + exp_avg_sq
  int64_t ema_bytes = 0;        ///< float32 EMA (0 when train.ema_decay is 0)
  /// dist.shard=gradients: bound on other ranks' gradient pieces alive during backward (0 otherwise); with
  /// train.offload=optimizer: the gradients on their way to the host (two layers' worth).
  int64_t in_flight_bytes = 0;
  /// train.offload=optimizer: the device holds the frozen weights and the copies of what trains (weight_bytes), no
  /// gradients, AdamW or EMA (0 here); host_bytes is what the host holds for it: master weights, gradient
  /// accumulation, AdamW moments, EMA (and with data parallelism the averaged gradients, views of the all-reduce
  /// buckets). Not part of persistent_bytes(), which is the device's.
  bool offload = false;
  int64_t host_bytes = 0;

  int64_t persistent_bytes() const {
    return weight_bytes + cast_bytes + grad_bytes + reducer_bytes + optimizer_bytes + ema_bytes;
  }
  /// Training peak of this rank with `activations` of its micro-batch, by MemoryPlan::peak_bytes's rule (the step
  /// holds the larger of the saved activations and the gradients plus the last layer's tensors), the gradients
  /// during backward being this rank's plus those in flight.
  int64_t peak_bytes(const model::ActivationMemory& activations) const;
};

/// `table`: the run's placement (placement.h: trainable flags and storage dtypes, registration order);
/// `params`: breakdown(table); `shard`: "none", "optimizer" or "gradients"; `bucket_bytes`: dist.bucket_size_mb · 2^20.
RankMemory plan_rank_memory(const PlacementTable& table, const ParamBreakdown& params, const std::string& shard,
                            int64_t world_size, int64_t bucket_bytes);

/// The same for a config (dist.shard, dist.bucket_size_mb, the freeze preset, precision, EMA, cast cache) with
/// train.offload resolved to `offload`.
RankMemory plan_rank_memory(const config::Config& cfg, int64_t world_size, bool offload);
/// The same with train.offload as written ("auto" counts as none).
RankMemory plan_rank_memory(const config::Config& cfg, int64_t world_size);

/// Why train.offload=optimizer cannot run at `world_size` ranks on GPUs (`cuda`) or CPUs, as one line, or "" when it
/// can: dist.shard other than none (the optimizer state is partitioned instead), or data parallelism over NCCL
/// (several GPUs; not supported yet).
std::string offload_refusal(const config::Config& cfg, int64_t world_size, bool cuda);
/// Why train.offload=optimizer cannot start on a host with `available_bytes` of memory when the plan puts
/// `needed_bytes` there (plan_rank_memory's host_bytes), as one line, or "" when it fits. available_bytes < 0: unknown
/// (no refusal).
std::string offload_host_memory_refusal(int64_t needed_bytes, int64_t available_bytes);
/// The host's available memory (/proc/meminfo MemAvailable) in bytes, -1 where it cannot be read.
int64_t host_available_bytes();

/// train.offload resolved: none and optimizer as written; auto picks the optimizer offload when the plan without it
/// (at the configured micro-batch; with train.gradient_checkpointing=auto, with every layer recomputed, which costs
/// far less than the host update) does not fit `device_bytes` (the GPU's memory) less kCardReserveBytes, and never
/// on the CPU (device_bytes 0: nothing to gain) or where offload_refusal() refuses it. `why` gets one line for the log.
bool choose_offload(const config::Config& cfg, int64_t world_size, int64_t device_bytes, std::string* why);

/// train.gradient_checkpointing resolved, with train.offload resolved to `offload`: false and true as written (none,
/// every layer); auto recomputes the fewest forward FLOPs among the splits (the first n SigLIP layers, the first m
/// joint layers) whose plan at the configured micro-batch fits `device_bytes` (the GPU's memory) less
/// kCardReserveBytes, choose_offload's rule; every layer when none fits (training then reports the shortfall as
/// without auto), and none on the CPU (device_bytes 0: no device memory to fit). A joint count is never the depth
/// less one (the same run as the depth: CheckpointedLayers). `why` gets one line for the log.
model::CheckpointedLayers choose_checkpointed_layers(const config::Config& cfg, int64_t world_size, bool offload,
                                                     int64_t device_bytes, std::string* why);

/// {"world_size", "shard", "rank", "share_elements", "weight_bytes", …, "persistent_bytes"}.
nlohmann::json rank_memory_json(const RankMemory& m);

/// Aligned text block, memory in GiB: one line per term, then the persistent total.
std::string format_rank_memory(const RankMemory& m);

/// Whether a config fits one of the GPUs users commonly own, and at which micro-batch.
struct CardFit {
  /// The card's memory as sold, in GiB (GB on the box; CUDA reports about that many GiB): 24 (RTX 3090/4090),
  /// 40 (A100 40GB), 48 (RTX A6000, L40S), 80 (A100/H100 80GB), or any size given to --card-gib.
  int64_t card_gib = 0;
  /// What the planned tensors may use: the card less kCardReserveBytes.
  int64_t budget_bytes = 0;
  /// The largest per-rank micro-batch (a divisor of train.batch_size / world size, so the global batch is kept with
  /// train.grad_accum_steps = per-rank batch / micro_batch) whose planned peak fits the budget; 0 when not even 1 fits.
  int64_t micro_batch = 0;
  int64_t grad_accum_steps = 0;  ///< per-rank batch / micro_batch (0 when nothing fits)
  int64_t peak_bytes = 0;        ///< the planned peak at micro_batch (at micro-batch 1 when nothing fits)
  bool offload = false;          ///< planned with train.offload=optimizer
  int64_t host_bytes = 0;        ///< host memory the offloaded state takes (0 without offload)
  /// Host memory of the process besides the offloaded state, at micro_batch (at 1 when nothing fits): the runtime
  /// and the data loader's batches (MemoryPlan::runtime_bytes). host_bytes + host_runtime_bytes is the row's host RAM.
  int64_t host_runtime_bytes = 0;
  /// The layers recomputed in backward at micro_batch: train.gradient_checkpointing as written, or with auto what
  /// choose_checkpointed_layers (the trainer's own choice) picks on this card (every layer when nothing fits).
  model::CheckpointedLayers checkpointed;
};
/// Kept free on a card for the CUDA context and the caching allocator's fragmentation: 2 GiB. Issue 33 sets
/// 22 GiB of tensors as what a 24 GB card holds, and on an H100 the plan's 68.3 GiB measured 69.4 GiB.
constexpr int64_t kCardReserveBytes = 2ll << 30;
/// The cards planned when none are named (GiB): 24, 40, 48, 80.
const std::vector<int64_t>& common_cards_gib();
/// --card-gib's value ("16,32,96,141": whole GiB, each more than the 2 GiB reserve and at most 4096), or UserError
/// naming `flag`, the value and what is expected.
std::vector<int64_t> parse_card_gib(const std::string& text, const std::string& flag = "--card-gib");
/// `cards_gib` for `cfg` at `world_size` ranks, with its precision, freezing, EMA, gradient checkpointing and
/// dist.shard, without and (`offload`) with the optimizer on the host; only the micro-batch (train.grad_accum_steps)
/// varies, largest first. With train.gradient_checkpointing=auto each micro-batch is planned with the layers
/// choose_checkpointed_layers picks for that card, as the trainer does at start-up: at the configured micro-batch
/// the row is the trainer's own choice.
std::vector<CardFit> plan_card_fits(const config::Config& cfg, int64_t world_size, bool offload,
                                    const std::vector<int64_t>& cards_gib = common_cards_gib());
/// Without offload.
std::vector<CardFit> plan_card_fits(const config::Config& cfg, int64_t world_size);

/// The report of `pi0-train --print-params` for a job of `world_size` ranks: the parameter breakdown
/// (format_breakdown), the per-rank shares when world_size > 1 (format_rank_memory), the activations of one
/// micro-batch, the predicted training peak (tensors on a GPU; tensors and resident memory on the CPU) and, when it
/// is higher, the start-up peak. `weights_from_file`: the model is built from a file (checkpoint.init_weights or
/// --resume), so there is no float32 random initialization at start-up. Text ending in a line break.
/// `cards_gib`: the cards of the fit table (--card-gib).
std::string format_memory_report(const config::Config& cfg, int64_t world_size, bool weights_from_file,
                                 const std::vector<int64_t>& cards_gib = common_cards_gib());

/// The same report as JSON: breakdown_json plus startup_peak_bytes, micro_batch, activation_bytes,
/// activation_transient_bytes, peak_bytes (tensors), per_rank (rank_memory_json), runtime_bytes,
/// allocator_slack_bytes, resident_peak_bytes (compare with the peak RSS), host_bytes (train.offload=optimizer: the
/// state on the host; on the CPU part of peak_bytes) and gpu_cards (plan_card_fits without offload, then with it:
/// card_gib, offload, budget_bytes, micro_batch, grad_accum_steps, peak_bytes, host_bytes, host_runtime_bytes,
/// checkpointed_vision, checkpointed_language, fits_without_offload each; with train.offload=auto, offload_auto: what
/// choose_offload picks on that card).
nlohmann::json memory_report_json(const config::Config& cfg, int64_t world_size, bool weights_from_file,
                                  const std::vector<int64_t>& cards_gib = common_cards_gib());

/// The log line of what one rank of a multi-process run holds, measured from its tensors: "rank 1 of 2 holds 1.18 MiB
/// of AdamW state, 604 KiB of EMA and 1.18 MiB of gradients (1234567, 617284 and 1234567 bytes; dist.shard=gradients)".
std::string format_held_state(int64_t rank, int64_t world_size, int64_t optimizer_bytes, int64_t ema_bytes,
                              int64_t grad_bytes, const std::string& shard);

}  // namespace pi0::train
