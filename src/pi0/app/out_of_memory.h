// What a program says when a device runs out of memory: one line (no 30-frame C++ stack trace) with the allocator's
// own figures, what the memory plan predicted for the job (pi0-train --print-params), how much the GPU has, and the
// levers that apply to this config. app::run_app prints it with exit code 3 (kExitOutOfMemory).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace pi0::app {

/// The job as pi0-train planned it: set once the config is loaded (set_out_of_memory_context), read if an
/// allocation fails later.
struct OutOfMemoryContext {
  int64_t predicted_peak_bytes = -1;  ///< tensors per rank, the plan's training peak (--print-params); -1 unknown
  int64_t world_size = 1;
  int64_t micro_batch = 0;            ///< samples per rank per micro-step
  int64_t grad_accum_steps = 1;
  /// Gradient checkpointing as the plan says it (train::describe_checkpointing): "on" (every layer), "off", or the
  /// layers train.gradient_checkpointing=auto chose, "12 of 27 vision, 10 of 18 language layers".
  std::string checkpointing = "off";
  std::string freeze;  ///< train.freeze
  std::string shard;   ///< dist.shard
};

void set_out_of_memory_context(const OutOfMemoryContext& context);
std::optional<OutOfMemoryContext> out_of_memory_context();

/// Bytes of a "<number> <unit>" size as LibTorch's allocator prints it (B, KiB, MiB, GiB, TiB); -1 if not one.
int64_t parse_allocator_size(const std::string& text);
/// The GPU's total memory as the CUDA allocator's message states it ("GPU 0 has a total capacity of 79.19 GiB"
/// in 2.x, "(GPU 0; 79.19 GiB total capacity; ..." in 1.13); -1 if the message does not say.
int64_t total_capacity_from_message(const std::string& allocator_message);

/// The one line (without the "<program>: out of memory: " prefix) for an allocation failure whose LibTorch message
/// is `allocator_message`. `gpu_total_bytes` < 0: taken from the message if it says, else not mentioned.
std::string out_of_memory_message(const std::string& allocator_message,
                                  const std::optional<OutOfMemoryContext>& context, int64_t gpu_total_bytes = -1);

}  // namespace pi0::app
