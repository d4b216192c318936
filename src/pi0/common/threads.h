// One CPU thread setting for everything that runs work in parallel: ATen's intra-op pool, OpenMP's default team
// and the BLAS's own pool. LibTorch 1.13 (Debian) calls the system BLAS's sgemm_ directly, and OpenBLAS keeps its
// own thread pool that torch::set_num_threads never reaches, so without this a "--threads 1" benchmark still ran
// its GEMMs on every core. The BLAS controls are looked up at run time (dlsym), so other BLAS builds link fine;
// when the BLAS is not OpenBLAS its count is reported as unknown.
#pragma once
#include <string>

namespace pi0 {

struct ThreadCounts {
  int aten = 0;          ///< at::get_num_threads()
  int openmp = 0;        ///< omp_get_max_threads(), 0 if OpenMP is not loaded
  int blas = 0;          ///< openblas_get_num_threads(), 0 if the BLAS is not OpenBLAS
  std::string blas_name; ///< "OpenBLAS <config>" or "unknown BLAS"

  /// "threads: aten 2, openmp 2, blas 2 (OpenBLAS 0.3.21 ...)": one line for build-info headers.
  std::string describe() const;
};

/// Sets ATen, OpenMP and the BLAS to `n` threads. n <= 0 means default_num_threads(). The three always agree.
/// Returns the effective counts.
ThreadCounts set_num_threads(int n);
/// Gives the calling thread one ATen intra-op thread (OpenMP's team size is per thread: each thread calling ATen
/// would otherwise get a team of set_num_threads' size, and the loader's workers, the training thread and the host
/// update would oversubscribe the cores). For threads that each do a small piece of work in parallel with others.
void use_one_intra_op_thread();
/// OMP_NUM_THREADS when set to a positive number, else the CPUs this process may run on (sched_getaffinity:
/// cgroup/taskset-aware, and counting hyperthreads, which ATen's own default of physical cores does not: on a
/// 2-vCPU machine that default was 1 thread and twice the step time).
int default_num_threads();
/// The effective counts now.
ThreadCounts thread_counts();

/// CPU seconds of the calling thread: unlike wall time it ignores other processes on a shared machine, and unlike
/// process time it leaves out worker threads (the loader's). On CUDA it counts only the host side.
double thread_cpu_seconds();

}  // namespace pi0
