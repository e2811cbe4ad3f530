/// \file
/// The activations of the feed-forward network, forward and backward: ReLU, GELU (exact, with erf, and PyTorch's
/// tanh approximation) and SwiGLU (Shazeer 2020, the Llama FFN).
///
/// Shapes: the pre-activation z (B, L, Fz) and the activation h (B, L, F), with Fz = F, or Fz = 2F for SwiGLU, whose
/// z holds the gate a in columns [0, F) and the value b in columns [F, 2F).
#pragma once

#include <selfattn/detail/rows.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>  // Array::erf, vectorised for float

#include <cmath>

namespace selfattn {

/// \brief The activation of a feed-forward network (PyTorch's `activation` argument, plus SwiGLU).
///
/// - relu:      h = max(z, 0)
/// - gelu:      h = z Phi(z) = z (1 + erf(z / sqrt 2)) / 2, PyTorch's F.gelu
/// - gelu_tanh: h = z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3))) / 2, PyTorch's F.gelu(approximate="tanh")
/// - swiglu:    h = silu(a) * b with silu(a) = a sigmoid(a), a and b the two halves of z (the first linear layer
///              is twice as wide: (2F, E))
enum class Activation { relu, gelu, gelu_tanh, swiglu };

/// The name PyTorch and the docs use: "relu", "gelu", "gelu_tanh", "swiglu".
inline const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::swiglu: return "swiglu";
  }
  return "unknown";
}

namespace detail {

/// Columns of the pre-activation for F hidden units: 2F for SwiGLU (gate and value), else F.
inline Index activation_input_width(Activation a, Index hidden) { return a == Activation::swiglu ? 2 * hidden : hidden; }

constexpr double sqrt_2_over_pi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double sqrt_half = 0.70710678118654752440;       // 1 / sqrt(2)
constexpr double gelu_tanh_cubic = 0.044715;

/// h = activation(z), row by row; h has F columns, z has activation_input_width(a, F).
template <typename T>
void activation_forward(Activation a, const TensorView<const T, 3>& z, const TensorView<T, 3>& h) {
  const Index f = h.dim(2), rows = h.dim(0) * h.dim(1);
  parallel_rows(rows, 8 * f, [&](Index r) {
    ArrayRow<T> out(row_of(h, r), f);
    const ConstArrayRow<T> in(row_of(z, r), f);
    switch (a) {
      case Activation::relu: out = in.max(T(0)); break;
      case Activation::gelu: out = T(0.5) * in * (T(1) + (in * T(sqrt_half)).erf()); break;
      case Activation::gelu_tanh:
        out = T(0.5) * in * (T(1) + (T(sqrt_2_over_pi) * (in + T(gelu_tanh_cubic) * in.cube())).tanh());
        break;
      case Activation::swiglu: {
        const ConstArrayRow<T> value(row_of(z, r) + f, f);
        out = in / (T(1) + (-in).exp()) * value;  // silu(a) b, silu(a) = a sigmoid(a)
        break;
      }
    }
  });
}

/// dz = dh * activation'(z), row by row (for SwiGLU: da = dh b silu'(a), db = dh silu(a)).
template <typename T>
void activation_backward(Activation a, const TensorView<const T, 3>& z, const TensorView<const T, 3>& dh,
                         const TensorView<T, 3>& dz) {
  const Index f = dh.dim(2), rows = dh.dim(0) * dh.dim(1);
  parallel_rows(rows, 16 * f, [&](Index r) {
    const ConstArrayRow<T> in(row_of(z, r), f);
    const ConstArrayRow<T> grad(row_of(dh, r), f);
    ArrayRow<T> out(row_of(dz, r), f);
    switch (a) {
      case Activation::relu: out = (in > T(0)).select(grad, T(0)); break;
      case Activation::gelu: {
        // d/dz z Phi(z) = Phi(z) + z phi(z), phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
        const T inv_sqrt_2pi = T(0.5 * sqrt_2_over_pi);
        out = grad * (T(0.5) * (T(1) + (in * T(sqrt_half)).erf()) + in * inv_sqrt_2pi * (T(-0.5) * in.square()).exp());
        break;
      }
      case Activation::gelu_tanh: {
        // h = z (1 + t) / 2, t = tanh(u), u = c (z + k z^3):  h' = (1 + t) / 2 + z (1 - t^2) c (1 + 3 k z^2) / 2
        const auto t = (T(sqrt_2_over_pi) * (in + T(gelu_tanh_cubic) * in.cube())).tanh().eval();
        out = grad * (T(0.5) * (T(1) + t) +
                      T(0.5) * in * (T(1) - t.square()) * T(sqrt_2_over_pi) * (T(1) + T(3 * gelu_tanh_cubic) * in.square()));
        break;
      }
      case Activation::swiglu: {
        const ConstArrayRow<T> value(row_of(z, r) + f, f);
        ArrayRow<T> d_value(row_of(dz, r) + f, f);
        const auto sigmoid = (T(1) / (T(1) + (-in).exp())).eval();
        // silu'(a) = sigmoid(a) (1 + a (1 - sigmoid(a)))
        out = grad * value * sigmoid * (T(1) + in * (T(1) - sigmoid));
        d_value = grad * in * sigmoid;
        break;
      }
    }
  });
}

}  // namespace detail
}  // namespace selfattn
