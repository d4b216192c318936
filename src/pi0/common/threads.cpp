#include "pi0/common/threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace pi0 {
namespace {

// A symbol of any library already loaded into the process (the BLAS and libgomp come with libtorch), or null.
template <class Fn>
Fn lookup(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, name));
}

using SetInt = void (*)(int);
using GetInt = int (*)();
using GetStr = char* (*)();

}  // namespace

std::string ThreadCounts::describe() const {
  auto count = [](int n) { return n > 0 ? std::to_string(n) : std::string("?"); };
  return "threads: aten " + std::to_string(aten) + ", openmp " + count(openmp) + ", blas " + count(blas) + " (" +
         blas_name + ")";
}

ThreadCounts thread_counts() {
  ThreadCounts c;
  c.aten = at::get_num_threads();
  if (auto f = lookup<GetInt>("omp_get_max_threads")) c.openmp = f();
  if (auto f = lookup<GetInt>("openblas_get_num_threads")) c.blas = f();
  if (auto f = lookup<GetStr>("openblas_get_config")) {
    const std::string cfg = f() ? f() : "";
    c.blas_name = cfg.rfind("OpenBLAS", 0) == 0 ? cfg : "OpenBLAS " + cfg;
    while (!c.blas_name.empty() && c.blas_name.back() == ' ') c.blas_name.pop_back();
  } else {
    c.blas_name = "unknown BLAS";
  }
  return c;
}

ThreadCounts set_num_threads(int n) {
  if (n > 0) at::set_num_threads(n);  // also sets OpenMP's team size when ATen's backend is OpenMP
  const int threads = at::get_num_threads();
  if (auto f = lookup<SetInt>("omp_set_num_threads")) f(threads);
  if (auto f = lookup<SetInt>("openblas_set_num_threads")) f(threads);
  return thread_counts();
}

}  // namespace pi0
