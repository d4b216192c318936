#include "pi0/common/threads.h"

#include <ctime>

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

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

int default_num_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && v > 0) return static_cast<int>(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadCounts set_num_threads(int n) {
  at::set_num_threads(n > 0 ? n : default_num_threads());  // also sets OpenMP's team size (OpenMP backend)
  const int threads = at::get_num_threads();
  if (auto f = lookup<SetInt>("omp_set_num_threads")) f(threads);
  if (auto f = lookup<SetInt>("openblas_set_num_threads")) f(threads);
  return thread_counts();
}

void use_one_intra_op_thread() {
  // ATen sets up each thread's team size once, at its first parallel op (lazy_init_num_threads, to the global count):
  // done first, so it does not undo this later.
  at::internal::lazy_init_num_threads();
  if (auto f = lookup<SetInt>("omp_set_num_threads")) f(1);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace pi0
