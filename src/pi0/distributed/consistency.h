// Start-up check that every rank trains the same thing: ranks exchange a hash of the resolved config and of the
// parameter layout and refuse to train when they differ (a stale config file on one node, a different LibTorch or
// freeze preset) — otherwise the gradient buckets would not line up and the job would hang or train garbage.
#pragma once
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "pi0/distributed/process_group.h"

namespace pi0::distributed {

/// 64-bit FNV-1a of `text` (stable across platforms and runs).
uint64_t fingerprint(const std::string& text);

/// One line per parameter: "name shape dtype requires_grad", in registration order.
std::string parameter_layout_text(const torch::OrderedDict<std::string, torch::Tensor>& named_parameters);

/// All-gathers the fingerprints of `config_text` and `layout_text` and throws pi0::UserError on every rank if any
/// rank differs from rank 0, naming what differs (resolved config / parameter layout) and the ranks.
void check_same_on_all_ranks(ProcessGroup& pg, const std::string& config_text, const std::string& layout_text);

}  // namespace pi0::distributed
