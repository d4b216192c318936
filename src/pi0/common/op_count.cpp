#include "pi0/common/op_count.h"

#include <ATen/record_function.h>

#include <cstring>
#include <memory>
#include <vector>

#include "pi0/common/check.h"

namespace pi0 {

namespace {
thread_local OpCount* t_count = nullptr;
thread_local KernelTally* t_tally = nullptr;  // non-null when the counter tallies by phase and name
thread_local int64_t t_depth = 0;
thread_local bool t_top_may_copy = false;  // the current top operation copies only if it dispatches a computing one
thread_local const char* t_top_name = nullptr;  // the current top operation's name (its schema's, lives on)
thread_local std::vector<std::string>* t_phases = nullptr;  // the ProfileScope ranges open, innermost last

bool in(const char* name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

// Operations that never launch a kernel: views, shape and metadata queries, allocations without a fill.
bool is_view(const char* name) {
  return in(name, {"aten::view", "aten::_unsafe_view", "aten::narrow", "aten::slice", "aten::select",
                   "aten::expand", "aten::expand_as", "aten::transpose", "aten::t", "aten::permute",
                   "aten::unsqueeze", "aten::squeeze", "aten::as_strided", "aten::alias", "aten::detach",
                   "aten::split", "aten::chunk", "aten::unbind", "aten::view_as", "aten::unflatten",
                   "aten::_reshape_alias", "aten::lift_fresh", "aten::empty", "aten::empty_like",
                   "aten::empty_strided", "aten::resize_", "aten::size", "aten::stride", "aten::numel",
                   "aten::is_nonzero", "aten::result_type", "aten::broadcast_tensors", "aten::_has_compatible_shallow_copy_type"});
}

// Operations that are views or no-ops unless they copy.
bool may_copy(const char* name) {
  return in(name, {"aten::to", "aten::reshape", "aten::contiguous", "aten::flatten", "aten::type_as",
                   "aten::reshape_as"});
}

void count_kernel(const char* name) {
  ++t_count->kernels;
  if (t_tally) {
    const std::string phase = t_phases && !t_phases->empty() ? t_phases->back() : std::string();
    ++(*t_tally)[{phase, name}];
  }
}

// Ranges that group operations without being one: autograd's node evaluations ("autograd::engine::evaluate_function:
// MmBackward0", FUNCTION scope on LibTorch 1.13) and Tensor::backward's own dispatch. The operations inside them are
// the kernels, counted as top-level ones.
bool is_grouping(const char* name) {
  return std::strncmp(name, "autograd::", 10) == 0 || std::strcmp(name, "aten::_backward") == 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) {  // a ProfileScope (only registered for a tallying counter)
    if (t_phases) t_phases->emplace_back(fn.name());
    return nullptr;
  }
  if (is_grouping(fn.name())) return nullptr;
  if (t_count) {
    ++t_count->all;
    const char* name = fn.name();
    if (t_depth == 0) {
      ++t_count->top;
      t_top_may_copy = may_copy(name);
      t_top_name = name;
      if (!t_top_may_copy && !is_view(name)) count_kernel(name);
    } else if (t_top_may_copy && !is_view(name) && !may_copy(name)) {
      count_kernel(t_top_name);  // the cast or reshape copies: one kernel, however many operations it takes
      t_top_may_copy = false;
    }
  }
  ++t_depth;
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    if (t_phases && !t_phases->empty()) t_phases->pop_back();
    return;
  }
  if (is_grouping(fn.name())) return;
  --t_depth;
}
}  // namespace

OpCounter::OpCounter(bool tally) {
  PI0_CHECK(t_count == nullptr, "an OpCounter is already counting on this thread");
  t_count = &count_;
  t_depth = 0;
  auto callback = at::RecordFunctionCallback(on_start, on_end);
  if (tally) {
    t_tally = &tally_;
    t_phases = new std::vector<std::string>();
    // Ranges: which phase each kernel belongs to. A range opened before the counter is not seen (its end is
    // ignored once the list is empty).
    callback.scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE});
  } else {
    callback.scopes({at::RecordScope::FUNCTION});
  }
  handle_ = at::addThreadLocalCallback(callback);
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  t_count = nullptr;
  t_tally = nullptr;
  delete t_phases;
  t_phases = nullptr;
}

bool OpCounter::active() { return t_count != nullptr; }

std::map<std::string, int64_t> kernels_per_phase(const KernelTally& tally) {
  std::map<std::string, int64_t> out;
  for (const auto& [key, n] : tally) out[key.first] += n;
  return out;
}

std::map<std::string, int64_t> kernels_per_name(const KernelTally& tally, const std::string& phase) {
  std::map<std::string, int64_t> out;
  for (const auto& [key, n] : tally)
    if (phase.empty() || key.first == phase) out[key.second] += n;
  return out;
}

}  // namespace pi0
