#include "pi0/app/out_of_memory.h"

#include <cstdio>
#include <mutex>
#include <regex>
#include <vector>

namespace pi0::app {

namespace {

std::mutex g_mutex;
std::optional<OutOfMemoryContext> g_context;

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

std::string first_match(const std::string& text, const std::regex& re) {
  std::smatch m;
  return std::regex_search(text, m, re) ? m[1].str() : "";
}

}  // namespace

void set_out_of_memory_context(const OutOfMemoryContext& context) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_context = context;
}

std::optional<OutOfMemoryContext> out_of_memory_context() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_context;
}

int64_t parse_allocator_size(const std::string& text) {
  static const std::regex re(R"(^\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return -1;
  const double v = std::stod(m[1].str());
  const std::string unit = m[2].str();
  const double scale = unit == "B" ? 1.0 : unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0
                       : unit == "GiB" ? 1073741824.0 : 1099511627776.0;
  return static_cast<int64_t>(v * scale + 0.5);
}

int64_t total_capacity_from_message(const std::string& message) {
  static const std::regex v2(R"(total capacity of ([0-9.]+ [KMGT]?i?B))");   // LibTorch 2.x
  static const std::regex v1(R"(([0-9.]+ [KMGT]?i?B) total capacity)");       // LibTorch 1.13
  std::string s = first_match(message, v2);
  if (s.empty()) s = first_match(message, v1);
  return s.empty() ? -1 : parse_allocator_size(s);
}

std::string out_of_memory_message(const std::string& allocator_message,
                                  const std::optional<OutOfMemoryContext>& context, int64_t gpu_total_bytes) {
  static const std::regex tried(R"(Tried to allocate ([0-9.]+ [KMGT]?i?B))");
  static const std::regex gpu_index(R"(GPU ([0-9]+))");
  const bool cuda = allocator_message.find("CUDA") != std::string::npos;
  if (gpu_total_bytes < 0) gpu_total_bytes = total_capacity_from_message(allocator_message);
  const std::string request = first_match(allocator_message, tried);
  const std::string index = first_match(allocator_message, gpu_index);

  std::string out = cuda ? "CUDA out of memory" + (index.empty() ? std::string() : " on cuda:" + index)
                         : "the allocator ran out of memory";
  std::vector<std::string> facts;
  if (!request.empty()) facts.push_back("tried to allocate " + request);
  if (gpu_total_bytes >= 0) facts.push_back("the GPU has " + gib(gpu_total_bytes) + " in total");
  if (!facts.empty()) {
    out += " (";
    for (size_t i = 0; i < facts.size(); ++i) out += (i ? "; " : "") + facts[i];
    out += ")";
  }
  if (!context) return out + "; use a smaller batch, or see docs/troubleshooting.md (out of memory)";

  const auto& c = *context;
  if (c.predicted_peak_bytes >= 0) {
    out += "; the memory plan (pi0-train --print-params) predicts a training peak of " +
           gib(c.predicted_peak_bytes) + " of tensors" + (c.world_size > 1 ? " per GPU" : "") + " (micro-batch " +
           std::to_string(c.micro_batch) + ", gradient checkpointing " + c.checkpointing +
           ")";
    if (gpu_total_bytes > 0 && c.predicted_peak_bytes < gpu_total_bytes)
      out += ", below the GPU's total: other processes may hold GPU memory (nvidia-smi), or the CUDA context and the "
             "allocator's reserve take the rest";
  }
  std::vector<std::string> levers;
  if (c.checkpointing != "on") levers.push_back("train.gradient_checkpointing=true");
  if (c.micro_batch > 1) {
    int64_t f = 2;
    while (c.micro_batch % f != 0) ++f;  // the smallest factor: the least accumulation that shrinks the micro-batch
    levers.push_back("train.grad_accum_steps=" + std::to_string(c.grad_accum_steps * f) + " (micro-batch " +
                     std::to_string(c.micro_batch / f) + ", same global batch)");
  }
  if (c.freeze != "lora" && c.freeze != "lora-only" && c.freeze != "action-expert-only" &&
      c.freeze != "projection-only")
    levers.push_back("a freeze preset that trains less (train.freeze=lora or action-expert-only)");
  if (c.shard != "gradients")
    levers.push_back(std::string("dist.shard=gradients") +
                     (c.world_size > 1 ? "" : " across several GPUs (torchrun, docs/distributed.md)"));
  if (levers.empty()) return out + "; every memory lever is in use already: a GPU with more memory is needed";
  out += "; levers: ";
  for (size_t i = 0; i < levers.size(); ++i) out += (i ? ", " : "") + levers[i];
  return out;
}

}  // namespace pi0::app
