/// \file
/// Softmax cross-entropy over the last dimension, and its gradient: the loss of a classifier or a language model's
/// next-token prediction (PyTorch's F.cross_entropy with reduction "mean" and ignore_index).
///
/// Dimension letters: B batch, L length, V classes (the vocabulary of a language model).
///
/// For each counted position (b, l), with z = logits[b, l, :] and t = targets(b, l):
///   lse = log sum_v exp(z_v)                      (computed as m + log sum_v exp(z_v - m), m = max_v z_v)
///   loss = (1 / N) sum over counted positions of (lse - z_t)         N = number of counted positions
///   d loss / d z_v = (softmax(z)_v - [v == t]) / N                   (0 for positions not counted)
/// Every row is reduced in double; the loss is the mean of the rows' losses, in nats.
#pragma once

#include <selfattn/detail/rows.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace selfattn {

/// \brief Options of softmax_cross_entropy.
struct CrossEntropyOptions {
  Index ignore_index = -100;  ///< positions whose target is this id count for nothing (PyTorch's default, -100)
  bool gradient = true;       ///< compute d_logits; false for the loss alone (evaluation)
};

/// \brief What softmax_cross_entropy returns: the mean loss, how many positions it averages, and its gradient.
template <typename T>
struct CrossEntropy {
  double loss = 0;  ///< mean of -log softmax(logits)[target] over the counted positions, in nats; NaN when count is 0
  Index count = 0;  ///< N: the positions whose target is not ignore_index
  /// (B, L, V): d loss / d logits = (softmax - one_hot(target)) / N, zero rows at ignored positions; empty
  /// unless opts.gradient (and all zero when N = 0).
  Tensor<T, 3> d_logits;
};

/// \brief Mean softmax cross-entropy of logits (B, L, V) against integer targets (B, L), and its gradient.
///
/// Shapes: logits (B, L, V), targets (B, L) of ids in [0, V) or equal to opts.ignore_index -> loss (a number),
/// d_logits (B, L, V). Checks first: ShapeError naming `targets`, std::invalid_argument naming `targets` (with the
/// position) for an id outside [0, V) that is not ignore_index. As PyTorch, the loss is NaN when every target is
/// ignored; the gradient is then zero. Non-finite logits give a non-finite loss (no check).
/// \code
/// Tensor<float, 3> logits = linear<float>(h, head_weight);   // (B, L, V)
/// CrossEntropy<float> ce = softmax_cross_entropy<float>(logits, targets);
/// std::printf("loss %.4f nats over %td positions\n", ce.loss, ce.count);
/// // backward: ce.d_logits (B, L, V) -> linear_backward, ...
/// \endcode
template <typename T>
CrossEntropy<T> softmax_cross_entropy(const TensorView<const T, 3>& logits, const TensorView<const Index, 2>& targets,
                                      const CrossEntropyOptions& opts = {}) {
  const char* fn = "softmax_cross_entropy";
  detail::check_shape<2>(fn, "targets", targets.shape(), {logits.dim(0), logits.dim(1)});
  const Index batch = logits.dim(0), length = logits.dim(1), classes = logits.dim(2);
  CrossEntropy<T> result;
  for (Index b = 0; b < batch; ++b)
    for (Index l = 0; l < length; ++l) {
      const Index t = targets(b, l);
      if (t == opts.ignore_index) continue;
      if (t < 0 || t >= classes)
        detail::throw_invalid(fn, "targets",
                              "id " + std::to_string(t) + " at (" + std::to_string(b) + ", " + std::to_string(l) +
                                  ") is outside [0, " + std::to_string(classes) + ") and is not ignore_index (" +
                                  std::to_string(opts.ignore_index) + ")");
      ++result.count;
    }
  if (opts.gradient) result.d_logits = Tensor<T, 3>(logits.shape());
  if (result.count == 0) {
    result.loss = std::numeric_limits<double>::quiet_NaN();
    return result;
  }

  // Row r = b L + l: its loss into row_loss[r] (0 when ignored), summed in row order afterwards so that the
  // result does not depend on the number of threads.
  const double scale = 1.0 / static_cast<double>(result.count);
  std::vector<double> row_loss(static_cast<std::size_t>(batch * length), 0.0);
  const TensorView<T, 3> d_logits = result.d_logits.view();
  detail::parallel_rows(batch * length, 4 * classes, [&](Index r) {
    const Index b = r / length, l = r % length, t = targets(b, l);
    if (t == opts.ignore_index) return;
    const T* z = &logits(b, l, 0);
    // 1. m = max_v z_v;  s = sum_v exp(z_v - m);  lse = m + log s
    const double m = static_cast<double>(*std::max_element(z, z + classes));
    double s = 0;
    for (Index v = 0; v < classes; ++v) s += std::exp(static_cast<double>(z[v]) - m);
    const double lse = m + std::log(s);
    // 2. loss_r = lse - z_t
    row_loss[static_cast<std::size_t>(r)] = lse - static_cast<double>(z[t]);
    // 3. d z_v = (exp(z_v - lse) - [v == t]) / N
    if (opts.gradient) {
      T* dz = &d_logits(b, l, 0);
      for (Index v = 0; v < classes; ++v) {
        const double p = std::exp(static_cast<double>(z[v]) - lse);
        dz[v] = static_cast<T>(((v == t ? p - 1.0 : p)) * scale);
      }
    }
  });
  double sum = 0;
  for (double x : row_loss) sum += x;
  result.loss = sum * scale;
  return result;
}

}  // namespace selfattn
