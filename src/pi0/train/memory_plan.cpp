#include "pi0/train/memory_plan.h"

#include <fstream>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <map>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"
#include "pi0/distributed/shard_layout.h"
#include "pi0/model/flops.h"
#include "pi0/model/model_config.h"

namespace pi0::train {
namespace {

// printf into a std::string (the report's lines are longer than a fixed buffer).
__attribute__((format(printf, 1, 2))) std::string printf_string(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

double gib(int64_t n) { return static_cast<double>(n) / (1ull << 30); }

// The figures both forms of the report are made of.
struct Report {
  MemoryPlan plan;
  RankMemory rank;
  int64_t startup_peak = 0;   // tensors of a model built from scratch (float32 init), before the optimizer state
  int64_t training_peak = 0;  // the largest rank's, = plan.peak_bytes() at world size 1
  int64_t peak = 0;           // the larger of the two
  int64_t beyond_tensors = 0; // the runtime and the allocator's slack: resident memory that is no tensor
};

Report make_report(const config::Config& cfg, int64_t world_size, bool weights_from_file) {
  Report r;
  r.plan = plan_memory(cfg, world_size);
  r.rank = plan_rank_memory(cfg, world_size);
  // A model built from scratch draws its random initialization in float32 before converting what is stored
  // narrower: that transient is the start-up peak. Weights from a file are created in their storage dtype.
  const bool from_file = weights_from_file || !cfg.checkpoint.init_weights.empty();
  r.startup_peak = from_file ? 0 : r.plan.params.total.total * 4;  // before the optimizer state exists
  r.training_peak = r.rank.peak_bytes(r.plan.activations);
  // On the CPU the host-resident state is in the same memory as everything else.
  if (cfg.train.device.rfind("cuda", 0) != 0) r.training_peak += r.rank.host_bytes;
  r.peak = std::max(r.startup_peak, r.training_peak);
  r.beyond_tensors = r.plan.runtime_bytes + r.plan.allocator_slack_bytes;
  return r;
}

}  // namespace

ParamBreakdown planned_breakdown(const config::Config& cfg) { return breakdown(make_placement(cfg)); }

namespace {
// Every camera slot goes through SigLIP, present or not (a missing camera is a masked black image).
const int64_t kPlannedCameras = static_cast<int64_t>(model::kCameraNames.size());

// The FAST and subtask blocks a step of cfg reads after the prompt (Pi0Impl::compute_prefix_loss).
model::TextBlocks text_blocks(const config::Config& cfg) {
  return {cfg.train.ki.enabled ? cfg.train.ki.max_fast_tokens : 0,
          cfg.train.subtask.enabled ? cfg.train.subtask.max_tokens : 0};
}

// The activations of `plan` without the FAST block (`fast`) or without the subtask block: what that block adds is
// the difference (model/activation_memory.h).
model::ActivationMemory without_block(const config::Config& cfg, const MemoryPlan& plan, bool fast) {
  auto blocks = text_blocks(cfg);
  (fast ? blocks.fast : blocks.subtask) = 0;
  return model::activation_memory(model::options_from_config(cfg.model), plan.micro_batch, plan.num_cameras,
                                  cfg.train.precision == "float32" ? 4 : 2, plan.checkpointed, blocks,
                                  gradient_reach(cfg));
}

// The activations of one micro-batch of `micro_batch` samples under cfg's precision, with the layers of
// `checkpointed` recomputed in backward (by default train.gradient_checkpointing as written), for the parts backward
// reaches (by default gradient_reach(cfg); callers planning many splits pass it once).
model::ActivationMemory planned_activations(const config::Config& cfg, int64_t micro_batch,
                                            std::optional<model::CheckpointedLayers> checkpointed = std::nullopt,
                                            std::optional<model::GradientReach> reach = std::nullopt) {
  return model::activation_memory(model::options_from_config(cfg.model), micro_batch, kPlannedCameras,
                                  cfg.train.precision == "float32" ? 4 : 2,
                                  checkpointed ? *checkpointed : planned_checkpointing(cfg),
                                  text_blocks(cfg), reach ? *reach : gradient_reach(cfg));
}

// The layer a parameter belongs to ("...layers.12"), or its module path outside the layer stacks.
std::string layer_of(const std::string& name) {
  const auto at = name.find("layers.");
  if (at == std::string::npos) return name.substr(0, name.rfind('.'));
  const auto end = name.find('.', at + 7);
  return name.substr(0, end);
}

// train.offload=optimizer: gradients reach the host layer by layer, so the device holds about two layers' worth at a
// time (one being produced, one being copied out): the two largest layers' device gradients.
int64_t gradients_in_flight_to_host(const PlacementTable& table) {
  std::map<std::string, int64_t> per_layer;
  for (const auto& p : table.params)
    if (p.on_host()) per_layer[layer_of(p.name)] += p.device_copy_bytes();
  std::vector<int64_t> sizes;
  for (const auto& [layer, bytes] : per_layer) sizes.push_back(bytes);
  std::sort(sizes.rbegin(), sizes.rend());
  int64_t bytes = 0;
  for (size_t i = 0; i < std::min<size_t>(2, sizes.size()); ++i) bytes += sizes[i];
  return bytes;
}
}  // namespace

model::GradientReach gradient_reach(const PlacementTable& table) {
  model::GradientReach reach{false, false};
  for (const auto& p : table.params) {
    if (!p.trainable) continue;
    // A LoRA factor belongs to the layer it adapts (freeze.h's rule).
    const auto lora = p.name.find(".lora_");
    const auto c = model::component_of(lora == std::string::npos ? p.name : p.name.substr(0, lora) + ".weight");
    if (p.name.find(".vision_tower.") != std::string::npos) reach.vision = true;
    if (c == "vision" || c == "language" || c == "embedding") reach.prefix = true;
  }
  // A frozen prefix expert keeps nothing: the joint layer cuts its rows from the graph (PaliGemmaWithExpertImpl::
  // layer_forward; before that, action-expert-only runs allocated as if it kept its tensors, 216.7 MB measured
  // against 164.9 planned without them, tests/integration/test_frozen_memory.cpp).
  return reach;
}

model::GradientReach gradient_reach(const config::Config& cfg) { return gradient_reach(make_placement(cfg)); }

model::CheckpointedLayers planned_checkpointing(const config::Config& cfg) {
  return cfg.train.gradient_checkpointing == "true" ? model::all_layers(model::options_from_config(cfg.model))
                                                    : model::CheckpointedLayers{};
}

std::string describe_checkpointing(const config::Config& cfg, const model::CheckpointedLayers& layers) {
  const auto all = model::all_layers(model::options_from_config(cfg.model));
  if (layers == all) return "on";
  if (layers == model::CheckpointedLayers{}) return "off";
  return printf_string("%lld of %lld vision, %lld of %lld language layers", static_cast<long long>(layers.vision),
                       static_cast<long long>(all.vision), static_cast<long long>(layers.language),
                       static_cast<long long>(all.language));
}

MemoryPlan plan_memory(const config::Config& cfg, int64_t world_size,
                       std::optional<model::CheckpointedLayers> checkpointed) {
  MemoryPlan plan;
  const auto table = make_placement(cfg);
  plan.params = breakdown(table);
  plan.micro_batch = config::micro_batch_size(cfg.train, world_size);
  plan.num_cameras = kPlannedCameras;
  plan.checkpointed = checkpointed ? *checkpointed : planned_checkpointing(cfg);
  plan.activations = planned_activations(cfg, plan.micro_batch, plan.checkpointed, gradient_reach(table));
  // The floor was measured with batches of one sample; larger batches add their queued and in-flight images
  // (without workers the loader builds one batch at a time on the trainer's thread).
  const int64_t local_batch = plan.micro_batch;  // what the loader builds per next()
  const int64_t image_bytes = plan.num_cameras * 3 * cfg.model.image_size * cfg.model.image_size * 4;
  const int64_t batches_held = cfg.data.num_workers == 0 ? 1 : cfg.data.prefetch + cfg.data.num_workers;
  plan.runtime_bytes = MemoryPlan::kRuntimeFloorBytes + batches_held * (local_batch - 1) * image_bytes;
  plan.allocator_slack_bytes = plan.activations.peak();
  if (table.offload) plan.offload_in_flight_bytes = gradients_in_flight_to_host(table);
  return plan;
}


int64_t RankMemory::peak_bytes(const model::ActivationMemory& activations) const {
  return persistent_bytes() - grad_bytes +
         std::max(activations.saved, grad_bytes + in_flight_bytes + activations.last_layer) + activations.transient;
}

RankMemory plan_rank_memory(const PlacementTable& table, const ParamBreakdown& params, const std::string& shard,
                            int64_t world_size, int64_t bucket_bytes) {
  PI0_CHECK(world_size >= 1, "plan_rank_memory: world size ", world_size);
  // The shares are laid out over the trainable parameters with their gradients' element sizes (placement.h),
  // as distributed::ShardLayout does for the built model.
  std::vector<int64_t> numels, element_sizes;
  int64_t largest = 0, grad_total = 0;
  for (const auto& p : table.params) {
    if (!p.trainable) continue;
    numels.push_back(p.numel);
    element_sizes.push_back(static_cast<int64_t>(c10::elementSize(p.storage)));
    largest = std::max(largest, p.grad_bytes());
    grad_total += p.grad_bytes();
  }
  PI0_CHECK(grad_total == params.total.grad_bytes, "plan_rank_memory: breakdown of another placement table");

  const auto mode = world_size > 1 ? distributed::parse_shard_mode(shard) : distributed::ShardMode::kNone;
  RankMemory m;
  m.world_size = world_size;
  m.shard = distributed::to_string(mode);
  m.trainable = params.total.trainable;
  m.weight_bytes = params.total.weight_bytes;
  m.cast_bytes = params.total.cast_bytes;
  if (table.offload) {
    PI0_CHECK(mode == distributed::ShardMode::kNone, "plan_rank_memory: train.offload with dist.shard=", shard);
    // The device keeps the frozen weights and the copies; the gradients leave during backward.
    for (const auto& p : table.params)
      if (p.on_host()) m.weight_bytes += p.device_copy_bytes() - p.weight_bytes();
    m.in_flight_bytes = gradients_in_flight_to_host(table);
    m.offload = true;
    m.share_elements = params.total.trainable;
    // Data parallel: the gradients are summed over ranks on the host, so each is accumulated in float32 there too.
    m.host_bytes = params.total.host_bytes + (world_size > 1 ? grad_total : 0) +
                   (world_size > 1 && !table.host_accumulation ? grad_total : 0);
    return m;
  }
  if (mode == distributed::ShardMode::kNone) {
    m.share_elements = params.total.trainable;
    m.grad_bytes = grad_total;
    m.optimizer_bytes = params.total.optimizer_bytes;
    m.ema_bytes = params.total.ema_bytes;
    // The gradients become views of the all-reduce buckets: while a bucket is packed, its gradients exist twice.
    if (world_size > 1) m.in_flight_bytes = std::min(grad_total, std::max(bucket_bytes, largest));
    return m;
  }
  // Sharded: the figures of the rank that owns the most bytes (the layout balances them within one element).
  const distributed::ShardLayout shards(numels, element_sizes, world_size);
  std::vector<int64_t> elements(static_cast<size_t>(world_size), 0);
  for (const auto& piece : shards.pieces()) elements[static_cast<size_t>(piece.owner)] += piece.numel();
  for (int64_t r = 0; r < world_size; ++r)
    if (shards.bytes_of(r) > shards.bytes_of(m.rank)) m.rank = r;
  m.share_elements = elements[static_cast<size_t>(m.rank)];
  const int64_t share_bytes = shards.bytes_of(m.rank);
  m.optimizer_bytes = 2 * share_bytes;
  m.ema_bytes = params.ema ? 4 * m.share_elements : 0;
  if (mode == distributed::ShardMode::kOptimizer) {
    m.grad_bytes = grad_total;  // all-reduced in full (as views of the buckets), the optimizer reads its elements
    m.in_flight_bytes = std::min(grad_total, std::max(bucket_bytes, largest));
  } else {
    m.grad_bytes = share_bytes;
    // ShardedGradReducer's window (2 × bucket) plus the gradient that was just produced, never more than all of them.
    m.in_flight_bytes = std::min(grad_total, 2 * bucket_bytes + largest);
  }
  return m;
}

RankMemory plan_rank_memory(const config::Config& cfg, int64_t world_size, bool offload) {
  const auto table = make_placement(cfg, offload);
  return plan_rank_memory(table, breakdown(table), cfg.dist.shard, world_size, cfg.dist.bucket_size_mb << 20);
}

RankMemory plan_rank_memory(const config::Config& cfg, int64_t world_size) {
  const auto table = make_placement(cfg);  // train.offload as written
  return plan_rank_memory(table, breakdown(table), cfg.dist.shard, world_size, cfg.dist.bucket_size_mb << 20);
}

std::string offload_refusal(const config::Config& cfg, int64_t world_size, bool cuda) {
  if (world_size == 1) return "";
  if (cfg.dist.shard != "none")
    return "train.offload=optimizer with dist.shard=" + cfg.dist.shard + ": not combined (the optimizer state is "
           "already on the host); use dist.shard=none, or train.offload=none";
  if (cuda)
    return "train.offload=optimizer with data parallelism over NCCL (several GPUs) is not supported yet; use "
           "train.offload=none with dist.shard=optimizer or gradients to split the optimizer state";
  return "";
}

bool choose_offload(const config::Config& cfg, int64_t world_size, int64_t device_bytes, std::string* why) {
  const auto& mode = cfg.train.offload;
  if (mode != "auto") {
    if (why) *why = "train.offload=" + mode;
    return mode == "optimizer";
  }
  if (device_bytes <= 0) {
    if (why) *why = "train.offload=auto: none (training on the CPU, where host and device memory are the same)";
    return false;
  }
  if (const auto refused = offload_refusal(cfg, world_size, /*cuda=*/true); !refused.empty()) {
    if (why) *why = "train.offload=auto: none (" + refused + ")";
    return false;
  }
  // With train.gradient_checkpointing=auto still to be chosen, the plan recomputes every layer: recomputation costs
  // about a third of a step, the host update several steps' worth (measured on an H200, pi0 batch 32: 22.2 samples/s
  // with every layer recomputed against 3.7 offloaded), so the optimizer leaves the GPU only when even that does
  // not fit; choose_checkpointed_layers then spends what is left on recomputing fewer layers.
  const bool ckpt_auto = cfg.train.gradient_checkpointing == "auto";
  const auto layers = ckpt_auto ? model::all_layers(model::options_from_config(cfg.model)) : planned_checkpointing(cfg);
  const auto activations = planned_activations(cfg, config::micro_batch_size(cfg.train, world_size), layers);
  const int64_t budget = device_bytes - kCardReserveBytes;
  const int64_t plain = plan_rank_memory(cfg, world_size, false).peak_bytes(activations);
  const char* with = ckpt_auto ? " with every layer checkpointed" : "";
  if (plain <= budget) {
    if (why)
      *why = printf_string("train.offload=auto: none (the plan's peak%s %.2f GiB fits the GPU's %.2f GiB less %.0f GiB)",
                           with, gib(plain), gib(device_bytes), gib(kCardReserveBytes));
    return false;
  }
  const auto offloaded = plan_rank_memory(cfg, world_size, true);
  if (why)
    *why = printf_string("train.offload=auto: optimizer (the plan's peak%s %.2f GiB does not fit the GPU's %.2f GiB "
                         "less %.0f GiB; with the optimizer on the host: %.2f GiB on the GPU, %.2f GiB of host memory)",
                         with, gib(plain), gib(device_bytes), gib(kCardReserveBytes), gib(offloaded.peak_bytes(activations)),
                         gib(offloaded.host_bytes));
  return true;
}

model::CheckpointedLayers choose_checkpointed_layers(const config::Config& cfg, int64_t world_size, bool offload,
                                                     int64_t device_bytes, std::string* why) {
  const auto& mode = cfg.train.gradient_checkpointing;
  if (mode != "auto") {
    if (why) *why = "train.gradient_checkpointing=" + mode;
    return planned_checkpointing(cfg);
  }
  if (device_bytes <= 0) {
    if (why) *why = "train.gradient_checkpointing=auto: off (training on the CPU: no device memory to fit)";
    return {};
  }
  const auto o = model::options_from_config(cfg.model);
  const auto all = model::all_layers(o);
  const int64_t micro_batch = config::micro_batch_size(cfg.train, world_size);
  const RankMemory rank = plan_rank_memory(cfg, world_size, offload);
  const int64_t budget = device_bytes - kCardReserveBytes;
  // A frozen part keeps nothing (model::GradientReach): recomputing its layers would free nothing, so no split that
  // does is chosen, and what a frozen part leaves unused goes to recomputing fewer of the others.
  const auto reach = gradient_reach(cfg);
  auto peak = [&](const model::CheckpointedLayers& c) {
    return rank.peak_bytes(planned_activations(cfg, micro_batch, c, reach));
  };
  // Recomputing a layer costs its forward pass once more. At pi0's sizes a SigLIP layer frees about a quarter of a
  // joint layer's bytes for about an eighth of its FLOPs (its attention probabilities are large for its width), so
  // SigLIP layers usually go first; but the peak is the largest of several moments, not a sum over layers
  // (model/activation_memory.h), so no fixed order is exact. Every split is planned instead (at most 28 × 18,
  // arithmetic only) and the one that fits with the fewest recomputed FLOPs wins, then the one with fewer layers.
  const auto flops = model::forward_flops(o, micro_batch, kPlannedCameras);
  const double vision_layer = static_cast<double>(flops.vision) / static_cast<double>(std::max<int64_t>(all.vision, 1));
  const double joint_layer = static_cast<double>(flops.prefix_linear + flops.suffix_linear + flops.attention) /
                             static_cast<double>(std::max<int64_t>(all.language, 1));
  std::optional<model::CheckpointedLayers> best;
  double best_cost = 0;
  for (int64_t v = 0; v <= all.vision; ++v) {
    for (int64_t l = 0; l <= all.language; ++l) {
      if (l == all.language - 1 && l > 0) continue;  // the same run as all.language (the last layer is kept)
      const model::CheckpointedLayers c{v, l};
      // The last joint layer is never recomputed: all.language costs all.language − 1 layers.
      const double cost = static_cast<double>(v) * vision_layer +
                          static_cast<double>(std::min(l, all.language - 1)) * joint_layer;
      if (best && (cost > best_cost || (cost == best_cost && v + l >= best->vision + best->language))) continue;
      if (peak(c) > budget) continue;
      best = c, best_cost = cost;
    }
  }
  const int64_t without = peak({});
  if (best && *best == model::CheckpointedLayers{}) {
    if (why)
      *why = printf_string("train.gradient_checkpointing=auto: off (the plan's peak %.2f GiB fits the GPU's %.2f GiB "
                           "less %.0f GiB)", gib(without), gib(device_bytes), gib(kCardReserveBytes));
    return {};
  }
  if (!best) {
    if (why)
      *why = printf_string("train.gradient_checkpointing=auto: on (every layer; even so the plan's peak %.2f GiB "
                           "does not fit the GPU's %.2f GiB less %.0f GiB)", gib(peak(all)), gib(device_bytes),
                           gib(kCardReserveBytes));
    return all;
  }
  if (why)
    *why = printf_string("train.gradient_checkpointing=auto: %s (the plan's peak %.2f GiB without checkpointing does "
                         "not fit the GPU's %.2f GiB less %.0f GiB; %.2f GiB with these layers recomputed, the split "
                         "that fits with the fewest recomputed FLOPs)", describe_checkpointing(cfg, *best).c_str(),
                         gib(without), gib(device_bytes), gib(kCardReserveBytes), gib(peak(*best)));
  return *best;
}

nlohmann::json rank_memory_json(const RankMemory& m) {
  return {{"world_size", m.world_size},
          {"shard", m.shard},
          {"rank", m.rank},
          {"trainable", m.trainable},
          {"share_elements", m.share_elements},
          {"weight_bytes", m.weight_bytes},
          {"cast_bytes", m.cast_bytes},
          {"grad_bytes", m.grad_bytes},
          {"reducer_bytes", m.reducer_bytes},
          {"optimizer_bytes", m.optimizer_bytes},
          {"ema_bytes", m.ema_bytes},
          {"persistent_bytes", m.persistent_bytes()},
          {"in_flight_bytes", m.in_flight_bytes},
          {"offload", m.offload ? "optimizer" : "none"},
          {"host_bytes", m.host_bytes}};
}

std::string format_rank_memory(const RankMemory& m) {
  const bool sharded = m.shard != "none";
  std::string out;
  char line[256];
  auto add = [&](const char* what, int64_t bytes, const std::string& note) {
    std::snprintf(line, sizeof line, "  %-22s %9.2f GiB%s%s\n", what, gib(bytes), note.empty() ? "" : "  ",
                  note.c_str());
    out += line;
  };
  std::snprintf(line, sizeof line, "per rank (world size %lld, dist.shard=%s%s):\n",
                static_cast<long long>(m.world_size), m.shard.c_str(),
                sharded ? (", rank " + std::to_string(m.rank) + " holds the largest share: " +
                           with_thousands(m.share_elements) + " of " + with_thousands(m.trainable) + " trainable")
                              .c_str()
                        : "");
  out += line;
  add("weights", m.weight_bytes, "replicated");
  add("casts", m.cast_bytes, "replicated");
  add("grads", m.grad_bytes, m.shard == "gradients" ? "this rank's share" : "all trainable");
  add("reduction buffers", m.reducer_bytes,
      m.shard == "gradients" ? "none kept: gradients are reduced to their owners during backward"
      : m.world_size > 1     ? "none kept: the gradients are views of the all-reduce buckets"
                             : "");
  add("optimizer", m.optimizer_bytes, sharded ? "this rank's share" : "all trainable");
  add("ema", m.ema_bytes, sharded ? "this rank's share" : "all trainable");
  add("persistent", m.persistent_bytes(), m.offload ? "on the device" : "");
  if (m.offload)
    add("on the host", m.host_bytes, "train.offload=optimizer: master weights, gradients, AdamW, EMA");
  if (m.in_flight_bytes > 0)
    add("in flight (backward)", m.in_flight_bytes,
        m.offload                ? "at most: two layers' gradients on their way to the host"
        : m.shard == "gradients" ? "at most: other ranks' gradient pieces being reduced"
                                 : "at most: a bucket being packed while its gradients still exist");
  return out;
}

std::string format_held_state(int64_t rank, int64_t world_size, int64_t optimizer_bytes, int64_t ema_bytes,
                              int64_t grad_bytes, const std::string& shard) {
  // Readable units first; the exact counts after them are what --print-params --world-size plans (and tests compare).
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " holds " +
         human_bytes(optimizer_bytes) + " of AdamW state, " + human_bytes(ema_bytes) + " of EMA and " +
         human_bytes(grad_bytes) + " of gradients (" + std::to_string(optimizer_bytes) + ", " +
         std::to_string(ema_bytes) + " and " + std::to_string(grad_bytes) + " bytes; dist.shard=" + shard + ")";
}

std::string offload_host_memory_refusal(int64_t needed_bytes, int64_t available_bytes) {
  if (available_bytes < 0 || needed_bytes <= available_bytes) return "";
  return printf_string("train.offload=optimizer: the plan puts %.2f GiB on the host (float32 master weights, AdamW "
                       "moments, EMA, gradient buffers: pi0-train --print-params lists them), this host has %.2f GiB "
                       "available (MemAvailable); use a host with more memory, train.ema_decay: 0 (no EMA), "
                       "train.grad_accum_steps: 1 (no float32 gradient buffer), or a freeze preset or LoRA",
                       gib(needed_bytes), gib(available_bytes));
}

int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

std::vector<CardFit> plan_card_fits(const config::Config& cfg, int64_t world_size) {
  return plan_card_fits(cfg, world_size, false);
}

const std::vector<int64_t>& common_cards_gib() {
  static const std::vector<int64_t> cards = {24, 40, 48, 80};
  return cards;
}

std::vector<int64_t> parse_card_gib(const std::string& text, const std::string& flag) {
  const std::string expected = "a comma-separated list of card sizes in whole GiB, each from 3 to 4096 (the plan "
                               "keeps 2 GiB free), e.g. 16,32,96,141";
  std::vector<int64_t> cards;
  size_t from = 0;
  while (true) {
    const size_t comma = text.find(',', from);
    const std::string item = text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || !std::isdigit(static_cast<unsigned char>(item[0])) || n < 3 || n > 4096)
      throw UserError(flag + " must be " + expected + " (got '" + text + "')");
    cards.push_back(n);
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return cards;
}

std::vector<CardFit> plan_card_fits(const config::Config& cfg, int64_t world_size, bool offload,
                                    const std::vector<int64_t>& cards_gib) {
  const int64_t per_rank = config::micro_batch_size(cfg.train, world_size) * cfg.train.grad_accum_steps;
  const bool ckpt_auto = cfg.train.gradient_checkpointing == "auto";
  // The persistent state does not depend on the micro-batch; the activations do. Each micro-batch that keeps the
  // global batch (a divisor of the per-rank batch), largest first.
  const RankMemory rank = plan_rank_memory(cfg, world_size, offload);
  std::vector<config::Config> with_micro_batch;  // cfg with train.grad_accum_steps = per-rank batch / micro-batch
  for (int64_t m = per_rank; m >= 1; --m) {
    if (per_rank % m != 0) continue;
    with_micro_batch.push_back(cfg);
    with_micro_batch.back().train.grad_accum_steps = per_rank / m;
  }
  std::vector<CardFit> fits;
  for (const int64_t card_gib : cards_gib) {
    CardFit f;
    f.card_gib = card_gib;
    f.budget_bytes = (card_gib << 30) - kCardReserveBytes;
    f.offload = offload;
    f.host_bytes = rank.host_bytes;
    for (const auto& c : with_micro_batch) {
      const int64_t m = config::micro_batch_size(c.train, world_size);
      // auto: the trainer's own choice for this card and micro-batch (every layer when none fits); else as written.
      const auto layers = ckpt_auto ? choose_checkpointed_layers(c, world_size, offload, card_gib << 30, nullptr)
                                    : planned_checkpointing(c);
      const auto plan = plan_memory(c, world_size, layers);
      const int64_t peak = rank.peak_bytes(plan.activations);
      // Micro-batch 1 is what the row reports when none fits.
      f.peak_bytes = peak, f.checkpointed = layers, f.host_runtime_bytes = plan.runtime_bytes;
      if (peak <= f.budget_bytes) {
        f.micro_batch = m, f.grad_accum_steps = per_rank / m;
        break;
      }
    }
    fits.push_back(f);
  }
  return fits;
}

namespace {
// The fit table, one row per card:
//   fits on GPUs (...):
//     24 GB  no (68.27 GiB at micro-batch 1, every layer recomputed)                 host 0.29 GiB
//     80 GB  micro-batch 32, recomputing 26 of 27 vision, 15 of 18 language layers (76.62 GiB)   host 0.83 GiB
// `without`: the same cards planned without offload, for the offloaded table's note on the cards that need none.
std::string format_card_fits(const config::Config& cfg, const std::vector<CardFit>& fits, int64_t world_size,
                             const std::vector<CardFit>* without = nullptr) {
  const bool offload = !fits.empty() && fits[0].offload;
  const bool ckpt_auto = cfg.train.gradient_checkpointing == "auto";
  const std::string per_rank = world_size > 1 ? " per rank" : "";
  std::string out =
      offload ? printf_string("with train.offload=optimizer (%.2f GiB of host memory for the offloaded state%s):\n",
                              gib(fits.empty() ? 0 : fits[0].host_bytes), per_rank.c_str())
              : printf_string("fits on GPUs%s (the plan's peak within the card less %.0f GiB for the CUDA context and "
                              "allocator%s):\n", per_rank.c_str(), gib(kCardReserveBytes),
                              ckpt_auto ? "; train.gradient_checkpointing=auto: the layers pi0-train recomputes on that "
                                          "card" : "");
  for (size_t i = 0; i < fits.size(); ++i) {
    const auto& f = fits[i];
    const std::string layers = describe_checkpointing(cfg, f.checkpointed);
    const std::string recompute = layers == "on"    ? "every layer recomputed"
                                  : layers == "off" ? "no layer recomputed"
                                                    : "recomputing " + layers;
    std::string row;
    if (f.micro_batch == 0) {
      row = printf_string("no (%.2f GiB at micro-batch 1, %s)", gib(f.peak_bytes), recompute.c_str());
    } else {
      const std::string accumulate =
          f.grad_accum_steps > 1 ? " × " + std::to_string(f.grad_accum_steps) + " accumulation steps" : "";
      row = printf_string("micro-batch %lld%s, %s (%.2f GiB)", static_cast<long long>(f.micro_batch),
                          accumulate.c_str(), recompute.c_str(), gib(f.peak_bytes));
    }
    out += printf_string("  %4lld GB  %-86s host %.2f GiB", static_cast<long long>(f.card_gib), row.c_str(),
                         gib(f.host_bytes + f.host_runtime_bytes));
    // The host update costs far more than recomputation (docs/memory.md: 24.9 samples/s against 18.1 offloaded on
    // an 80 GB card): where the card holds the run without it, offload only buys memory that is not needed.
    if (offload && without && i < without->size() && (*without)[i].micro_batch > 0)
      out += printf_string(" · fits without offload (micro-batch %lld): offload trades speed for memory there",
                           static_cast<long long>((*without)[i].micro_batch));
    out += "\n";
  }
  return out;
}

// train.offload=auto's choice on each card, by choose_offload (the trainer's rule): "24 GB optimizer · 80 GB none".
std::string format_offload_auto(const config::Config& cfg, int64_t world_size, const std::vector<int64_t>& cards_gib) {
  std::string out = "train.offload=auto picks:";
  for (size_t i = 0; i < cards_gib.size(); ++i)
    out += printf_string("%s%lld GB %s", i == 0 ? " " : " · ", static_cast<long long>(cards_gib[i]),
                         choose_offload(cfg, world_size, cards_gib[i] << 30, nullptr) ? "optimizer" : "none");
  return out + "\n";
}
}  // namespace

std::string format_memory_report(const config::Config& cfg, int64_t world_size, bool weights_from_file,
                                 const std::vector<int64_t>& cards_gib) {
  const Report r = make_report(cfg, world_size, weights_from_file);
  const auto& plan = r.plan;
  std::string out = format_breakdown(plan.params);
  if (world_size > 1) out += format_rank_memory(r.rank);
  // auto is decided by the trainer from the GPU's memory; the report plans it as off here (planned_checkpointing)
  // and per card in the fit table below.
  const std::string checkpointing =
      describe_checkpointing(cfg, plan.checkpointed) +
      (cfg.train.gradient_checkpointing == "auto"
           ? " (auto: pi0-train recomputes only the layers the GPU needs; each card's choice is in the table below)"
           : "");
  out += printf_string("activations (micro-batch %lld, %lld cameras, %s, gradient checkpointing %s): %.2f GiB kept "
                       "for backward + %.2f GiB transient\n",
                       static_cast<long long>(plan.micro_batch), static_cast<long long>(plan.num_cameras),
                       cfg.train.precision.c_str(), checkpointing.c_str(), gib(plan.activations.saved),
                       gib(plan.activations.transient));
  if (cfg.train.ki.enabled) {
    const auto off = without_block(cfg, plan, true);
    out += printf_string("  of which knowledge insulation (train.ki, %lld FAST tokens per sample): %.2f GiB kept (%.2f "
                         "GiB float32 CE logits at the FAST target rows, %.2f GiB detached prefix K/V copies, the "
                         "rest the FAST tokens in the backbone's pass) + %.2f GiB transient\n",
                         static_cast<long long>(cfg.train.ki.max_fast_tokens),
                         gib(plan.activations.saved - off.saved), gib(plan.activations.ki_logits),
                         gib(plan.activations.kv_copies), gib(plan.activations.transient - off.transient));
  }
  if (cfg.train.subtask.enabled) {
    const auto off = without_block(cfg, plan, false);
    out += printf_string("  of which subtask prediction (train.subtask, %lld tokens per sample): %.2f GiB kept (%.2f "
                         "GiB float32 CE logits at the subtask target rows, the rest the block's rows in the "
                         "backbone's pass and %s) + %.2f GiB transient\n",
                         static_cast<long long>(cfg.train.subtask.max_tokens), gib(plan.activations.saved - off.saved),
                         gib(plan.activations.subtask_logits),
                         cfg.train.ki.enabled ? "the expert's K/V copies of them"
                                              : "the expert's pass, which reads copies of the prefix and block K/V",
                         gib(plan.activations.transient - off.transient));
  }
  if (cfg.train.device.rfind("cuda", 0) == 0) {
    // Tensors live on the GPU there; the host-side runtime and glibc slack terms were calibrated on CPU runs.
    out += printf_string("predicted training peak%s: %.2f GiB of tensors on the GPU (+ the CUDA context and the "
                         "caching allocator's reserve)", world_size > 1 ? " per rank" : "", gib(r.training_peak));
    out += r.rank.offload ? printf_string("; %.2f GiB of host memory (train.offload=optimizer; the transfer buffers "
                                          "pinned)\n", gib(r.rank.host_bytes))
                          : std::string("\n");
  } else {
    out += printf_string("predicted training peak%s: %.2f GiB of tensors; resident (peak RSS) %.2f GiB with the "
                         "process runtime (%.2f GiB: libraries, threads, data loader) and the allocator's slack "
                         "(%.2f GiB, one activation working set: calibrated at batch 1)\n",
                         world_size > 1 ? " per rank" : "", gib(r.training_peak),
                         gib(r.training_peak + r.beyond_tensors), gib(plan.runtime_bytes),
                         gib(plan.allocator_slack_bytes));
  }
  const auto without = plan_card_fits(cfg, world_size, false, cards_gib);
  out += format_card_fits(cfg, without, world_size);
  if (offload_refusal(cfg, world_size, /*cuda=*/true).empty()) {
    out += format_card_fits(cfg, plan_card_fits(cfg, world_size, true, cards_gib), world_size, &without);
    if (cfg.train.offload == "auto") out += format_offload_auto(cfg, world_size, cards_gib);
  }
  if (r.startup_peak > r.training_peak) {
    out += printf_string("start-up peak: %.2f GiB of tensors, %.2f GiB resident (random initialization in float32; "
                         "set checkpoint.init_weights to build directly in the storage dtypes)\n",
                         gib(r.startup_peak), gib(r.startup_peak + r.beyond_tensors));
  }
  return out;
}

nlohmann::json memory_report_json(const config::Config& cfg, int64_t world_size, bool weights_from_file,
                                  const std::vector<int64_t>& cards_gib) {
  const Report r = make_report(cfg, world_size, weights_from_file);
  const auto& plan = r.plan;
  const auto& b = plan.params;
  auto j = breakdown_json(b);
  j["startup_peak_bytes"] = std::max(r.startup_peak, b.total.memory_bytes() - b.total.grad_bytes);
  j["micro_batch"] = plan.micro_batch;
  j["activation_bytes"] = plan.activations.saved;
  j["activation_transient_bytes"] = plan.activations.transient;
  if (cfg.train.ki.enabled) {
    j["ki_fast_tokens"] = cfg.train.ki.max_fast_tokens;
    j["ki_logit_bytes"] = plan.activations.ki_logits;
    j["ki_kv_copy_bytes"] = plan.activations.kv_copies;
  }
  if (cfg.train.subtask.enabled) {
    j["subtask_tokens"] = cfg.train.subtask.max_tokens;
    j["subtask_logit_bytes"] = plan.activations.subtask_logits;
    j["subtask_activation_bytes"] = plan.activations.saved - without_block(cfg, plan, false).saved;
    j["prefix_kv_copy_bytes"] = plan.activations.kv_copies;  // of P and the block, as ki_kv_copy_bytes with train.ki
  }
  j["peak_bytes"] = r.peak;  // tensors only: what the allocator holds
  j["per_rank"] = rank_memory_json(r.rank);
  j["runtime_bytes"] = plan.runtime_bytes;
  j["allocator_slack_bytes"] = plan.allocator_slack_bytes;
  j["resident_peak_bytes"] = r.peak + r.beyond_tensors;  // compare with the peak RSS
  j["host_bytes"] = r.rank.host_bytes;
  auto cards = nlohmann::json::array();
  const auto without = plan_card_fits(cfg, world_size, false, cards_gib);
  auto fits = without;
  if (offload_refusal(cfg, world_size, /*cuda=*/true).empty()) {
    const auto offloaded = plan_card_fits(cfg, world_size, true, cards_gib);
    fits.insert(fits.end(), offloaded.begin(), offloaded.end());
  }
  for (size_t i = 0; i < fits.size(); ++i) {
    const auto& f = fits[i];
    nlohmann::json card = {{"card_gib", f.card_gib},
                           {"offload", f.offload ? "optimizer" : "none"},
                           {"budget_bytes", f.budget_bytes},
                           {"micro_batch", f.micro_batch},
                           {"grad_accum_steps", f.grad_accum_steps},
                           {"peak_bytes", f.peak_bytes},
                           {"host_bytes", f.host_bytes},
                           {"host_runtime_bytes", f.host_runtime_bytes},
                           {"checkpointed_vision", f.checkpointed.vision},
                           {"checkpointed_language", f.checkpointed.language},
                           {"fits_without_offload", without[i % without.size()].micro_batch > 0}};
    if (cfg.train.offload == "auto")
      card["offload_auto"] = choose_offload(cfg, world_size, f.card_gib << 30, nullptr) ? "optimizer" : "none";
    cards.push_back(card);
  }
  j["gpu_cards"] = cards;
  return j;
}

}  // namespace pi0::train
