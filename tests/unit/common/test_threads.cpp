// One thread setting for ATen, OpenMP and the BLAS: after set_num_threads(n) all three report n (the BLAS only
// when it is OpenBLAS, whose pool torch::set_num_threads does not reach).
#include <catch2/catch.hpp>

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
  // 0 keeps ATen's count and makes the others follow it.
  const auto c = pi0::set_num_threads(0);
  CHECK(c.aten == 2);
  if (c.blas_name.rfind("OpenBLAS", 0) == 0) CHECK(c.blas == 2);
  pi0::set_num_threads(before);
}
