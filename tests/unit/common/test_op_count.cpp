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
