// A device running out of memory: one line, exit 3, with the allocator's figures, the plan's prediction and the
// levers that apply (issue 22: it printed a 30-frame C++ stack trace). The allocator messages below are the
// formats LibTorch's CUDA caching allocator prints (2.x, then 1.13).
#include <catch2/catch.hpp>

#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "pi0/app/cli.h"
#include "pi0/app/out_of_memory.h"

using Catch::Contains;
using Catch::EndsWith;
using Catch::StartsWith;
using namespace pi0;

namespace {

const std::string kMessage2x =
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 76.50 GiB "
    "is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";
const std::string kMessage113 =
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 39.59 GiB total capacity; 38.50 GiB already allocated; "
    "10.81 MiB free; 38.90 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
    "max_split_size_mb to avoid fragmentation.";

app::OutOfMemoryContext full_finetune() {
  app::OutOfMemoryContext c;
  c.predicted_peak_bytes = int64_t(95) << 30;
  c.micro_batch = 32;
  c.grad_accum_steps = 1;
  c.checkpointing = "off";
  c.freeze = "full";
  c.shard = "none";
  return c;
}

}  // namespace

TEST_CASE("out of memory: sizes and the GPU's total read from both allocator formats", "[unit][app]") {
  CHECK(app::parse_allocator_size("2.00 GiB") == int64_t(2) << 30);
  CHECK(app::parse_allocator_size("20.00 MiB") == int64_t(20) << 20);
  CHECK(app::parse_allocator_size("512 B") == 512);
  CHECK(app::parse_allocator_size("79.19 GiB") == static_cast<int64_t>(79.19 * (1ull << 30) + 0.5));
  CHECK(app::parse_allocator_size("lots") == -1);
  CHECK(app::total_capacity_from_message(kMessage2x) == app::parse_allocator_size("79.19 GiB"));
  CHECK(app::total_capacity_from_message(kMessage113) == app::parse_allocator_size("39.59 GiB"));
  CHECK(app::total_capacity_from_message("something else") == -1);
}

TEST_CASE("out of memory: the line names the plan's peak, the GPU's total and the levers that apply",
          "[unit][app]") {
  const auto line = app::out_of_memory_message(kMessage2x, full_finetune());
  CHECK_THAT(line, StartsWith("CUDA out of memory on cuda:0 (tried to allocate 2.00 GiB; the GPU has 79.19 GiB in "
                              "total)"));
  CHECK_THAT(line, Contains("the memory plan (pi0-train --print-params) predicts a training peak of 95.00 GiB of "
                            "tensors (micro-batch 32, gradient checkpointing off)"));
  CHECK_THAT(line, Contains("levers: train.gradient_checkpointing=true, train.grad_accum_steps=2 (micro-batch 16, "
                            "same global batch), a freeze preset that trains less (train.freeze=lora or "
                            "action-expert-only), dist.shard=gradients across several GPUs"));
  CHECK_THAT(line, !Contains("below the GPU's total"));
  CHECK(line.find('\n') == std::string::npos);

  // Levers already pulled are not offered again; the next accumulation step divides the micro-batch.
  auto c = full_finetune();
  c.checkpointing = "on";
  c.micro_batch = 9;
  c.grad_accum_steps = 2;
  c.freeze = "lora";
  c.shard = "gradients";
  c.world_size = 4;
  c.predicted_peak_bytes = int64_t(30) << 30;
  const auto pulled = app::out_of_memory_message(kMessage113, c);
  CHECK_THAT(pulled, StartsWith("CUDA out of memory on cuda:1 (tried to allocate 20.00 MiB; the GPU has 39.59 GiB"));
  CHECK_THAT(pulled, Contains("30.00 GiB of tensors per GPU (micro-batch 9, gradient checkpointing on), below the "
                              "GPU's total: other processes may hold GPU memory"));
  CHECK_THAT(pulled, Contains("levers: train.grad_accum_steps=6 (micro-batch 3, same global batch)"));
  CHECK_THAT(pulled, !Contains("gradient_checkpointing=true") && !Contains("train.freeze=") &&
                         !Contains("dist.shard="));
  c.micro_batch = 1;
  CHECK_THAT(app::out_of_memory_message(kMessage113, c), EndsWith("a GPU with more memory is needed"));
  // train.gradient_checkpointing=auto recomputing some layers: they are named, and checkpointing all is a lever.
  c.checkpointing = "12 of 27 vision, 10 of 18 language layers";
  const auto partial = app::out_of_memory_message(kMessage113, c);
  CHECK_THAT(partial, Contains("(micro-batch 1, gradient checkpointing 12 of 27 vision, 10 of 18 language layers)"));
  CHECK_THAT(partial, EndsWith("levers: train.gradient_checkpointing=true"));

  // Without a plan (pi0-infer, pi0-serve) the line still gives the figures and a way on; the total can come from
  // the caller when the message has none.
  CHECK(app::out_of_memory_message("CUDA out of memory. Tried to allocate 1.00 GiB.", std::nullopt, int64_t(8) << 30) ==
        "CUDA out of memory (tried to allocate 1.00 GiB; the GPU has 8.00 GiB in total); use a smaller batch, or see "
        "docs/troubleshooting.md (out of memory)");
}

TEST_CASE("out of memory: run_app prints one line and exits 3", "[unit][app]") {
  app::set_out_of_memory_context(full_finetune());
  std::ostringstream buf;
  auto* old = std::cerr.rdbuf(buf.rdbuf());
  const int code = app::run_app("pi0-train", []() -> int {
    TORCH_CHECK_WITH(OutOfMemoryError, false, kMessage2x);
    return 0;
  });
  std::cerr.rdbuf(old);
  const std::string text = buf.str();
  CHECK(code == 3);
  CHECK(code == app::kExitOutOfMemory);
  CHECK_THAT(text, StartsWith("pi0-train: out of memory: CUDA out of memory on cuda:0 (tried to allocate 2.00 GiB; "
                              "the GPU has 79.19 GiB in total); the memory plan"));
  CHECK_THAT(text, Contains("levers: train.gradient_checkpointing=true"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  CHECK_THAT(text, !Contains("frame #") && !Contains("Exception raised from"));
}
