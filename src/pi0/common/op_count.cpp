#include "pi0/common/op_count.h"

#include <ATen/record_function.h>

#include <cstring>
#include <memory>

#include "pi0/common/check.h"

namespace pi0 {

namespace {
thread_local OpCount* t_count = nullptr;
thread_local int64_t t_depth = 0;
thread_local bool t_top_may_copy = false;  // the current top operation copies only if it dispatches a computing one

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

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (t_count) {
    ++t_count->all;
    const char* name = fn.name();
    if (t_depth == 0) {
      ++t_count->top;
      t_top_may_copy = may_copy(name);
      if (!t_top_may_copy && !is_view(name)) ++t_count->kernels;
    } else if (t_top_may_copy && !is_view(name) && !may_copy(name)) {
      ++t_count->kernels;  // the cast or reshape copies: one kernel, however many operations it takes
      t_top_may_copy = false;
    }
  }
  ++t_depth;
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) { --t_depth; }
}  // namespace

OpCounter::OpCounter() {
  PI0_CHECK(t_count == nullptr, "an OpCounter is already counting on this thread");
  t_count = &count_;
  t_depth = 0;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  t_count = nullptr;
}

}  // namespace pi0
