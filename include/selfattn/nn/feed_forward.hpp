/// \file
/// The position-wise feed-forward network of a transformer layer, forward and backward:
///   y = linear2(dropout(activation(linear1(x))))
/// with PyTorch's nn.Linear layout (y = x W^T + b) and names (linear1.weight, linear1.bias, linear2.weight,
/// linear2.bias), as in nn.TransformerEncoderLayer.
///
/// Shapes: x (B, L, E) -> z = linear1(x) (B, L, Fz) -> h = activation(z) (B, L, F) -> y = linear2(h) (B, L, E), with
/// Fz = F, or 2F for SwiGLU (linear1_weight (2F, E): the gate's F rows, then the value's).
#pragma once

#include <selfattn/detail/dropout.hpp>
#include <selfattn/errors.hpp>
#include <selfattn/nn/activation.hpp>
#include <selfattn/nn/module_input.hpp>
#include <selfattn/projection.hpp>
#include <selfattn/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>

namespace selfattn {

/// \brief Configuration of a FeedForward network. The constructor throws std::invalid_argument naming the field
/// when it is invalid.
struct FeedForwardConfig {
  Index embed_dim = 0;                       ///< E: input and output width (>= 1)
  Index ffn_dim = 2048;                      ///< F: hidden width (>= 1; PyTorch's dim_feedforward)
  Activation activation = Activation::relu;  ///< relu, gelu, gelu_tanh or swiglu
  double dropout = 0.0;                      ///< dropout on the hidden activation h, training mode only, in [0, 1)
  bool bias = true;                          ///< biases on both linear layers
};

/// \brief The parameters of a FeedForward network (or their gradients), nn.Linear layout; biases empty when !bias.
///
/// Shapes: linear1_weight (Fz, E), linear1_bias (Fz), linear2_weight (E, F), linear2_bias (E), Fz = F or 2F (SwiGLU).
template <typename T>
struct FeedForwardParams {
  Tensor<T, 2> linear1_weight;  ///< (Fz, E): z = x linear1_weight^T + linear1_bias
  Tensor<T, 1> linear1_bias;    ///< (Fz), or empty
  Tensor<T, 2> linear2_weight;  ///< (E, F): y = h linear2_weight^T + linear2_bias
  Tensor<T, 1> linear2_bias;    ///< (E), or empty
};

namespace detail {

/// What the network's backward needs of its forward: z and the hidden activation after dropout.
template <typename T>
struct FeedForwardSaved {
  Tensor<T, 3> pre_activation;  ///< z = linear1(x), (B, L, Fz)
  Tensor<T, 3> hidden;          ///< dropout(activation(z)), (B, L, F): the input of linear2
};

/// The parameters one call of the network reads (views: a TransformerLayer keeps them in its own params).
template <typename T>
struct FeedForwardWeights {
  TensorView<const T, 2> linear1_weight;
  TensorView<const T, 1> linear1_bias;
  TensorView<const T, 2> linear2_weight;
  TensorView<const T, 1> linear2_bias;
};

/// y = linear2(dropout(activation(linear1(x)))) into y (B, L, E); dropout with rate p keyed by `seed` (p = 0: none).
template <typename T>
void feed_forward_forward(Activation activation, T p, std::uint64_t seed, const TensorView<const T, 3>& x,
                          const FeedForwardWeights<T>& w, FeedForwardSaved<T>& saved, const TensorView<T, 3>& y) {
  const Index batch = x.dim(0), length = x.dim(1);
  saved.pre_activation = Tensor<T, 3>({batch, length, w.linear1_weight.dim(0)});
  saved.hidden = Tensor<T, 3>({batch, length, w.linear2_weight.dim(1)});
  StackedProjection<T> unused;  // T weights: linear_into_stored widens nothing (its few-row kernel as inference's)
  linear_into_stored<T, T>(x, w.linear1_weight, w.linear1_bias, saved.pre_activation.view(), unused);  // z = x W1^T + b1
  activation_forward<T>(activation, saved.pre_activation.view(), saved.hidden.view());  // h = act(z)
  dropout_activations<T>(saved.hidden.view(), p, seed);                                 // h = dropout(h)
  linear_into_stored<T, T>(saved.hidden.view(), w.linear2_weight, w.linear2_bias, y, unused);  // y = h W2^T + b2
}

/// y = linear2(activation(linear1(x))) into y (B, L, E) for inference (no dropout, nothing saved) with the weights
/// stored as P: T (then bitwise feed_forward_forward with p = 0), or 16 bits with T = float (linear_into_stored:
/// a few rows read the weights in place, more widen them once into `scratch`; bitwise float weights of the same
/// values either way).
template <typename T, typename P>
void feed_forward_inference(Activation activation, const TensorView<const T, 3>& x, const FeedForwardWeights<P>& w,
                            const TensorView<T, 3>& y, StackedProjection<T>& scratch) {
  const Index batch = x.dim(0), length = x.dim(1);
  Tensor<T, 3> pre_activation({batch, length, w.linear1_weight.dim(0)});
  Tensor<T, 3> hidden({batch, length, w.linear2_weight.dim(1)});
  linear_into_stored<T, P>(x, w.linear1_weight, w.linear1_bias, pre_activation.view(), scratch);  // z = x W1^T + b1
  activation_forward<T>(activation, pre_activation.view(), hidden.view());                       // h = act(z)
  linear_into_stored<T, P>(hidden.view(), w.linear2_weight, w.linear2_bias, y, scratch);         // y = h W2^T + b2
}

/// The forward's walk in reverse; gradients of the parameters into `dparams` (biases only when `bias`).
template <typename T>
Tensor<T, 3> feed_forward_backward(Activation activation, T p, std::uint64_t seed, const TensorView<const T, 3>& x,
                                   const FeedForwardWeights<T>& w, const FeedForwardSaved<T>& saved,
                                   const TensorView<const T, 3>& dy, bool bias, FeedForwardParams<T>& dparams) {
  // y = h W2^T + b2:  dh = dy W2, dW2 = dy^T h, db2 = sum dy
  LinearGradients<T> second = linear_backward<T>(saved.hidden.view(), w.linear2_weight, dy, bias);
  dparams.linear2_weight = std::move(second.dweight);
  dparams.linear2_bias = std::move(second.dbias);
  // h = dropout(act(z)):  d act = dh * mask / (1 - p);  dz = d act * act'(z)
  dropout_activations<T>(second.dx.view(), p, seed);
  Tensor<T, 3> dz(saved.pre_activation.shape());
  activation_backward<T>(activation, saved.pre_activation.view(), second.dx.view(), dz.view());
  // z = x W1^T + b1:  dx = dz W1, dW1 = dz^T x, db1 = sum dz
  LinearGradients<T> first = linear_backward<T>(x, w.linear1_weight, dz.view(), bias);
  dparams.linear1_weight = std::move(first.dweight);
  dparams.linear1_bias = std::move(first.dbias);
  return std::move(first.dx);
}

/// Throws std::invalid_argument naming the field of an invalid configuration (`prefix` names where it sits).
inline void check_feed_forward_config(const char* function, const std::string& prefix, const FeedForwardConfig& c) {
  if (c.embed_dim < 1)
    throw_invalid(function, prefix + "embed_dim", "expected >= 1, got " + std::to_string(c.embed_dim));
  if (c.ffn_dim < 1) throw_invalid(function, prefix + "ffn_dim", "expected >= 1, got " + std::to_string(c.ffn_dim));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    throw_invalid(function, prefix + "dropout", "expected a value in [0, 1), got " + std::to_string(c.dropout));
}

/// Throws ShapeError naming the parameter whose shape is not the configured one.
template <typename T>
void check_feed_forward_params(const char* function, const std::string& prefix, const FeedForwardConfig& c,
                               const Tensor<T, 2>& w1, const Tensor<T, 1>& b1, const Tensor<T, 2>& w2,
                               const Tensor<T, 1>& b2) {
  const Index hidden_in = activation_input_width(c.activation, c.ffn_dim), with_bias = c.bias ? 1 : 0;
  check_shape<2>(function, prefix + "linear1_weight", w1.shape(), {hidden_in, c.embed_dim});
  check_shape<1>(function, prefix + "linear1_bias", b1.shape(), {with_bias * hidden_in});
  check_shape<2>(function, prefix + "linear2_weight", w2.shape(), {c.embed_dim, c.ffn_dim});
  check_shape<1>(function, prefix + "linear2_bias", b2.shape(), {with_bias * c.embed_dim});
}

/// PyTorch's nn.Linear initialisation: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)], drawn from `generator`
/// (our own uniform draw: std::uniform_real_distribution differs between standard libraries).
template <typename T>
void init_linear(std::mt19937_64& generator, Tensor<T, 2>& weight, Tensor<T, 1>& bias, Index out, Index in, bool with_bias) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  const auto uniform = [&]() { return static_cast<T>(bound * (2.0 * static_cast<double>(generator() >> 11) * 0x1.0p-53 - 1.0)); };
  weight = Tensor<T, 2>({out, in});
  for (Index n = 0; n < weight.size(); ++n) weight.data()[n] = uniform();
  bias = with_bias ? Tensor<T, 1>(std::array<Index, 1>{out}) : Tensor<T, 1>();
  for (Index n = 0; n < bias.size(); ++n) bias.data()[n] = uniform();
}

}  // namespace detail

/// \brief What FeedForward::forward returns: the output and what the backward needs.
template <typename T>
struct FeedForwardForward {
  Tensor<T, 3> output;           ///< (B, L, E)
  TensorView<const T, 3> input;  ///< (B, L, E): view of x (owned by `kept` if x was a temporary)
  std::shared_ptr<const detail::FeedForwardSaved<T>> saved;  ///< Internal: z and the hidden activation
  std::shared_ptr<const Tensor<T, 3>> kept;                  ///< Internal: x when it was passed as a temporary
  T dropout_p = T(0);            ///< the dropout rate the forward ran with (0 outside training mode)
  std::uint64_t seed = 0;        ///< the dropout seed the forward ran with
};

/// \brief What FeedForward::backward returns: d_input (B, L, E) and the parameter gradients.
template <typename T>
struct FeedForwardGradients {
  Tensor<T, 3> d_input;         ///< (B, L, E)
  FeedForwardParams<T> params;  ///< gradients, same names and shapes as params()
};

/// \brief The position-wise feed-forward network y = linear2(dropout(activation(linear1(x)))).
///
/// Shapes: forward(x (B, L, E)) -> output (B, L, E); parameters as in FeedForwardParams. forward and backward are
/// const: one network serves many threads.
/// \code
/// FeedForwardConfig cfg;
/// cfg.embed_dim = 512;
/// cfg.ffn_dim = 2048;
/// cfg.activation = Activation::gelu;
/// FeedForward<float> ffn(cfg);                    // nn.Linear's initialisation, seed 0
/// FeedForwardForward<float> f = ffn.forward(x);  // x (B, L, 512)
/// FeedForwardGradients<float> g = ffn.backward(dout, f);
/// \endcode
template <typename T>
class FeedForward {
  static_assert(std::is_floating_point_v<T>, "FeedForward<T>: T is float or double");

 public:
  /// nn.Linear's uniform initialisation of both layers; `seed` picks the draw.
  explicit FeedForward(const FeedForwardConfig& config, std::uint64_t seed = 0) : config_(config) {
    detail::check_feed_forward_config("FeedForward", "cfg.", config_);
    std::mt19937_64 generator(seed);
    detail::init_linear(generator, params_.linear1_weight, params_.linear1_bias,
                        detail::activation_input_width(config_.activation, config_.ffn_dim), config_.embed_dim,
                        config_.bias);
    detail::init_linear(generator, params_.linear2_weight, params_.linear2_bias, config_.embed_dim, config_.ffn_dim,
                        config_.bias);
  }

  const FeedForwardConfig& config() const { return config_; }  ///< the configuration
  /// The parameters, writable (keep their shapes; do not change them between a forward and its backward).
  FeedForwardParams<T>& params() { return params_; }
  /// \overload
  const FeedForwardParams<T>& params() const { return params_; }
  /// Dropout (cfg.dropout) applies only in training mode; the default is false.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }  ///< whether dropout is on

  /// \brief y = linear2(dropout(activation(linear1(x)))) for x (B, L, E); `seed` keys the dropout mask (training
  /// mode). A temporary Tensor argument is moved into the result; a named one stays the caller's to keep alive.
  template <typename X>
  FeedForwardForward<T> forward(X&& x, std::uint64_t seed = 0) const {
    FeedForwardForward<T> f;
    if constexpr (detail::check_module_arguments<T, X>()) {
      detail::SavedInput<T> in = detail::save_input<T>(std::forward<X>(x));
      detail::check_shape<3>(forward_name, "x", in.view.shape(), {detail::any_extent, detail::any_extent, config_.embed_dim});
      check_params(forward_name);
      f.dropout_p = training_ ? static_cast<T>(config_.dropout) : T(0);
      f.seed = seed;
      auto saved = std::make_shared<detail::FeedForwardSaved<T>>();
      f.output = Tensor<T, 3>(in.view.shape());
      detail::feed_forward_forward<T>(config_.activation, f.dropout_p, seed, in.view, weights(), *saved, f.output.view());
      f.saved = std::move(saved);
      f.input = in.view;
      f.kept = std::move(in.owned);
    }
    return f;
  }

  /// \brief Gradients given dout = d loss / d output (B, L, E); the parameters must be unchanged since the forward.
  template <typename DO>
  FeedForwardGradients<T> backward(const DO& dout, const FeedForwardForward<T>& f) const {
    FeedForwardGradients<T> g;
    if constexpr (detail::check_module_arguments<T, DO>()) {
      if (!f.saved) detail::throw_invalid(backward_name, "fwd", "is not the result of a forward call");
      detail::check_shape<3>(backward_name, "dout", detail::const_view(dout).shape(), f.output.shape());
      check_params(backward_name);
      g.d_input = detail::feed_forward_backward<T>(config_.activation, f.dropout_p, f.seed, f.input, weights(), *f.saved,
                                                   detail::const_view(dout), config_.bias, g.params);
    }
    return g;
  }

 private:
  static constexpr const char* forward_name = "FeedForward::forward";
  static constexpr const char* backward_name = "FeedForward::backward";

  detail::FeedForwardWeights<T> weights() const {
    return {params_.linear1_weight.view(), params_.linear1_bias.view(), params_.linear2_weight.view(),
            params_.linear2_bias.view()};
  }

  void check_params(const char* function) const {
    detail::check_feed_forward_params(function, "params().", config_, params_.linear1_weight, params_.linear1_bias,
                                      params_.linear2_weight, params_.linear2_bias);
  }

  FeedForwardConfig config_;
  FeedForwardParams<T> params_;
  bool training_ = false;
};

}  // namespace selfattn
