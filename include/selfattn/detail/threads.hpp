// selfattn/detail/threads.hpp — how many threads a kernel call uses. OpenMP is optional: the kernels are
// written for it (`#pragma omp` loops) and run on one thread without it. Threads never change results
// beyond rounding; every kernel documents its own order of summation.
#pragma once

#include <selfattn/tensor.hpp>

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace selfattn::detail {

/// The number of threads the kernels may use: OpenMP's count, or 1 without OpenMP.
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// The calling thread's number inside a kernel's parallel region (0 without OpenMP).
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Calls with fewer nominal multiply-adds than this run on one thread: opening a parallel region costs about
/// 1.5 us on an idle core and a scheduler time slice (0.2 to 1.4 ms measured) when the other core is busy,
/// while 2^20 multiply-adds take about 20 us.
constexpr double parallel_min_work = 1 << 20;

/// Threads for a call of `work` multiply-adds split into `tasks` independent tasks.
inline int threads_for(double work, Index tasks) {
  if (work < parallel_min_work) return 1;
  return static_cast<int>(std::max<Index>(1, std::min<Index>(max_threads(), tasks)));
}

}  // namespace selfattn::detail
