// OpCounter: counts the ATen operations dispatched on its thread while alive, the caller's own ("top") and all.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "pi0/common/check.h"
#include "pi0/common/op_count.h"

using namespace pi0;

TEST_CASE("OpCounter counts the operations a piece of code dispatches", "[unit][common]") {
  const auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  OpCount three, none;
  {
    OpCounter counter;
    auto c = a + b;
    c = c * b;
    c = torch::matmul(c, a);  // composite: dispatches to mm (and views) below it
    three = counter.count();
  }
  CHECK(three.top == 3);
  CHECK(three.all > three.top);
  CHECK(three.kernels == 3);
  {
    OpCounter counter;
    none = counter.count();
  }
  CHECK(none.top == 0);
  CHECK(none.all == 0);
  // After the counter: nothing counts, and a second counter on the same thread is refused while one lives.
  OpCounter outer;
  CHECK_THROWS_AS(OpCounter(), c10::Error);
  CHECK(outer.count().all == 0);
}

TEST_CASE("OpCounter's kernels leave out views and casts or reshapes that do not copy", "[unit][common]") {
  const auto a = torch::randn({4, 6});
  OpCounter counter;
  auto v = a.view({6, 4}).transpose(0, 1).narrow(0, 0, 2);  // three views: no kernel
  auto same = a.to(torch::kFloat32).reshape({24}).contiguous();  // no-ops and a view: no kernel
  CHECK(counter.count().top >= 5);  // contiguous() of a contiguous tensor may not dispatch at all
  CHECK(counter.count().kernels == 0);
  auto cast = a.to(torch::kFloat64);                  // copies: one kernel
  auto copied = a.t().reshape({24});                  // copies: one kernel
  auto sum = v + 1;                                   // computes: one
  CHECK(counter.count().kernels == 3);
  CHECK(cast.numel() + copied.numel() + sum.numel() + same.numel() > 0);
}
