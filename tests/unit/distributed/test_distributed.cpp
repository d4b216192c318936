// pi0::distributed pieces in one process: environment parsing, and the GradReducer with two ranks on two threads
// (Gloo on 127.0.0.1), checked against gradients averaged by hand.
#include <catch2/catch.hpp>

#include <map>
#include <thread>

#include "pi0/common/check.h"
#include "pi0/distributed/consistency.h"
#include "pi0/distributed/dist_env.h"
#include "pi0/distributed/grad_reducer.h"
#include "pi0/distributed/process_group.h"
#include "support/distributed_support.h"

namespace {

using pi0::distributed::DistEnv;
using pi0::testing::Replica;

DistEnv parse(const std::map<std::string, std::string>& vars) {
  return pi0::distributed::dist_env_from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("dist env: single process, torchrun and SLURM", "[unit][dist]") {
  CHECK_FALSE(parse({}).distributed());
  const auto t = parse({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node4"},
                        {"MASTER_PORT", "1234"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  CHECK(t.launcher == "torchrun");
  CHECK(t.rank == 3);
  CHECK(t.world_size == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.master_addr == "node4");
  CHECK(t.master_port == 1234);
  CHECK(t.agent_store);
  const auto s = parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                        {"SLURM_JOB_NODELIST", "gpu[007-009,12],cpu1"}, {"SLURM_JOB_ID", "123456"}});
  CHECK(s.launcher == "slurm");
  CHECK(s.rank == 5);
  CHECK(s.world_size == 16);
  CHECK(s.local_rank == 1);
  CHECK(s.master_addr == "gpu007");
  CHECK(s.master_port == 20000 + 123456 % 20000);
  CHECK(pi0::distributed::first_host_of_nodelist("node7") == "node7");
  CHECK(pi0::distributed::first_host_of_nodelist("a[1-2]-ib,b") == "a1-ib");
}

TEST_CASE("dist env: bad values name the variable", "[unit][dist]") {
  CHECK_THROWS_WITH(parse({{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
                    "environment variable RANK must be an integer (got 'x')");
  CHECK_THROWS_WITH(parse({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "environment variable RANK=2 must be < WORLD_SIZE=2");
  CHECK_THROWS_WITH(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                    Catch::Contains("MASTER_PORT must be a TCP port"));
  CHECK_THROWS_WITH(parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), Catch::Contains("export MASTER_ADDR"));
}

TEST_CASE("GradReducer averages gradients over two ranks", "[unit][dist]") {
  // With the unused parameter, w1's bucket waits behind the incomplete [unused, w2] bucket (launched in wait());
  // without it, every bucket is launched from the hooks during backward.
  const bool with_unused = GENERATE(true, false);
  torch::Tensor xs[2][2];  // [rank][micro], drawn here, before the rank threads start
  for (int r = 0; r < 2; ++r)
    for (int micro = 0; micro < 2; ++micro) xs[r][micro] = torch::randn({5, 16});
  auto inputs = [&](int rank, int micro) { return xs[rank][micro]; };
  // Reference: each rank's accumulated local gradients (2 micro-steps), averaged over the two ranks.
  std::map<std::string, torch::Tensor> expected;
  for (int r = 0; r < 2; ++r) {
    Replica m(with_unused);
    for (int micro = 0; micro < 2; ++micro) m.loss(inputs(r, micro)).backward();
    for (auto& [n, p] : m.params)
      if (p.grad().defined()) expected[n] = expected.count(n) ? expected[n] + p.grad() / 2 : p.grad() / 2;
  }
  std::map<std::string, torch::Tensor> got[2];
  int64_t buckets = 0, rereductions = 0;
  const auto errors = pi0::testing::run_two_ranks([&](pi0::distributed::ProcessGroup& pg, int rank) {
    Replica m(with_unused);
    // Filled from the last parameter: [d] (float64), [unused, w2] (268 B), [w1] (1 KiB > 600 B). The second
    // bucket only completes in wait() (unused), so the third, ready early, waits for it: launches stay in order.
    pi0::distributed::GradReducer reducer(pg, m.params, 600);
    if (rank == 0) buckets = reducer.num_buckets();
    for (int step = 0; step < 2; ++step) {  // twice: the reducer's per-step state must reset
      for (auto& [n, p] : m.params) p.mutable_grad() = torch::Tensor();
      for (int micro = 0; micro < 2; ++micro) {
        reducer.enable_sync(micro == 1);
        m.loss(inputs(rank, micro)).backward();
      }
      reducer.wait();
    }
    for (auto& [n, p] : m.params) got[rank][n] = p.grad();
    if (rank == 0) rereductions = reducer.stats().rereductions;
    pi0::distributed::check_same_on_all_ranks(pg, "config", "layout");
  });
  REQUIRE(errors[0].empty());
  REQUIRE(errors[1].empty());
  INFO("with_unused " << with_unused);
  CHECK(buckets == 3);
  // TODO(ddp): the re-reduction path (a parameter accumulated again after its bucket left) is not triggered here
  // (observed 0); find out whether the engine orders w1's two accumulations before w2's, and assert it then.
  WARN("with_unused " << with_unused << ": " << rereductions << " re-reductions");
  for (int r = 0; r < 2; ++r) {
    if (with_unused) CHECK_FALSE(got[r]["unused"].defined());  // no rank used it: stays undefined, as without DDP
    for (const auto& [n, e] : expected) {
      INFO("rank " << r << " " << n);
      REQUIRE(got[r][n].defined());
      CHECK(torch::allclose(got[r][n], e, 1e-6, 1e-7));
    }
  }
}

TEST_CASE("consistency check names what differs", "[unit][dist]") {
  const auto errors = pi0::testing::run_two_ranks([&](pi0::distributed::ProcessGroup& pg, int rank) {
    pi0::distributed::check_same_on_all_ranks(pg, "same config", rank == 0 ? "layout a" : "layout b");
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("parameter layout (names, shapes, dtypes, requires_grad) of rank(s) 1 differs "
                                  "from rank 0's"));
  }
}
