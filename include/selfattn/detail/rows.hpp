/// \file
/// Row-wise loops over (B, L, C) activations, as the norms and activations of the transformer layer run them: the
/// B L rows of C contiguous values, as Eigen arrays, on several threads when there is enough work.
/// No public names.
#pragma once

#include <selfattn/detail/threads.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

namespace selfattn::detail {

template <typename T>
using ArrayRow = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
template <typename T>
using ConstArrayRow = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;

/// Row r of a (B, L, C) view, r = b L + l.
template <typename T>
T* row_of(const TensorView<T, 3>& x, Index r) {
  return x.data() + (r / x.dim(1)) * x.stride(0) + (r % x.dim(1)) * x.stride(1);
}

/// Calls f(r) for every row r of a (B, L, C) tensor, on several threads when there is enough work.
template <typename F>
void parallel_rows(Index rows, Index row_work, F&& f) {
  const int threads = threads_for(static_cast<double>(rows) * static_cast<double>(row_work), rows);
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#else
  (void)threads;
#endif
  for (Index r = 0; r < rows; ++r) f(r);
}

}  // namespace selfattn::detail
