#include "pi0/common/op_count.h"

#include <ATen/record_function.h>

#include <memory>

#include "pi0/common/check.h"

namespace pi0 {

namespace {
thread_local OpCount* t_count = nullptr;
thread_local int64_t t_depth = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  if (t_count) {
    ++t_count->all;
    if (t_depth == 0) ++t_count->top;
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
