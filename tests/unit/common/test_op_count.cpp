// OpCounter: counts the ATen operations dispatched on its thread while alive, the caller's own ("top") and all.
#include <catch2/catch.hpp>

#include <torch/torch.h>

#include "pi0/common/check.h"
#include "pi0/common/op_count.h"
#include "pi0/common/profiler.h"

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

TEST_CASE("OpCounter's tally: kernels by the innermost ProfileScope open and by operation name", "[unit][common]") {
  const auto a = torch::randn({4, 4});
  KernelTally tally;
  {
    ProfileScope before("pi0::before");  // opened before the counter: not a phase it sees
    OpCounter counter(/*tally=*/true);
    auto c = a + a;  // outside every range the counter saw open
    {
      ProfileScope outer(pi0::phase::kBackward);
      c = torch::mm(c, a);
      {
        ProfileScope inner(pi0::phase::kRecompute);
        c = c.to(torch::kFloat64);  // copies: one kernel, under its own name
        c = c * 2;
      }
      c = c.view({16});  // a view: no kernel
    }
    CHECK(counter.count().kernels == 4);
    tally = counter.tally();
  }
  CHECK(tally.size() == 4);
  CHECK(tally.at({"", "aten::add"}) == 1);
  CHECK(tally.at({pi0::phase::kBackward, "aten::mm"}) == 1);
  CHECK(tally.at({pi0::phase::kRecompute, "aten::to"}) == 1);
  CHECK(tally.at({pi0::phase::kRecompute, "aten::mul"}) == 1);
  CHECK(kernels_per_phase(tally) == std::map<std::string, int64_t>{{"", 1}, {pi0::phase::kBackward, 1},
                                                                    {pi0::phase::kRecompute, 2}});
  CHECK(kernels_per_name(tally, pi0::phase::kRecompute) ==
        std::map<std::string, int64_t>{{"aten::mul", 1}, {"aten::to", 1}});
  CHECK(kernels_per_name(tally).size() == 4);
  // Without a tally nothing is kept by name.
  OpCounter plain;
  auto d = a + a;
  CHECK(d.numel() == 16);
  CHECK(plain.tally().empty());
  CHECK(plain.count().kernels == 1);
  CHECK(OpCounter::active());
}
