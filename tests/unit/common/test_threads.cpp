// One thread setting for ATen, OpenMP and the BLAS: after set_num_threads(n) all three report n (the BLAS only
// when it is OpenBLAS, whose pool torch::set_num_threads does not reach).
#include <catch2/catch.hpp>

#include <sched.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Parallel.h>

#include "pi0/common/threads.h"

TEST_CASE("set_num_threads governs ATen, OpenMP and OpenBLAS together", "[unit][common]") {
  const int before = at::get_num_threads();
  for (int n : {1, 2}) {
    const auto c = pi0::set_num_threads(n);
    INFO(c.describe());
    CHECK(c.aten == n);
    if (c.openmp > 0) CHECK(c.openmp == n);
    if (c.blas_name.rfind("OpenBLAS", 0) == 0) {
      CHECK(c.blas == n);
    } else {
      WARN("the BLAS is not OpenBLAS (" << c.blas_name << "): its thread count is not checked");
    }
    CHECK(c.describe().find("aten " + std::to_string(n)) != std::string::npos);
  }
  // 0 means the default: OMP_NUM_THREADS, else every CPU of the affinity mask; the others follow.
  pi0::set_num_threads(1);
  const auto c = pi0::set_num_threads(0);
  CHECK(c.aten == pi0::default_num_threads());
  if (c.blas_name.rfind("OpenBLAS", 0) == 0) CHECK(c.blas == c.aten);
  pi0::set_num_threads(before);
}

TEST_CASE("the default thread count is every CPU the process may run on", "[unit][common]") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string saved = env ? env : "";
  ::unsetenv("OMP_NUM_THREADS");
  CHECK(pi0::default_num_threads() == CPU_COUNT(&set));
  ::setenv("OMP_NUM_THREADS", "3", 1);
  CHECK(pi0::default_num_threads() == 3);
  ::setenv("OMP_NUM_THREADS", "junk", 1);
  CHECK(pi0::default_num_threads() == CPU_COUNT(&set));
  if (env) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else ::unsetenv("OMP_NUM_THREADS");
}

TEST_CASE("use_one_intra_op_thread gives only the calling thread one ATen thread", "[unit][common]") {
  pi0::set_num_threads(2);
  int inside = 0, inside_after_op = 0;
  std::thread worker([&] {
    pi0::use_one_intra_op_thread();
    inside = at::get_num_threads();
    // ATen's own per-thread set-up at the first parallel op must not undo it.
    at::parallel_for(0, 1 << 20, 1, [](int64_t, int64_t) {});
    inside_after_op = at::get_num_threads();
  });
  worker.join();
  CHECK(inside == 1);
  CHECK(inside_after_op == 1);
  CHECK(at::get_num_threads() == 2);  // the calling thread's team keeps its size
  std::thread other([&] { inside = at::get_num_threads(); });
  other.join();
  CHECK(inside == 2);  // and a new thread still gets the global count
  pi0::set_num_threads(0);
}
