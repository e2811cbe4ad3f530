/// \file
/// AdamW (Loshchilov & Hutter, 2019: Adam with decoupled weight decay), PyTorch's torch.optim.AdamW, over a list of
/// ParameterRef (train/parameters.hpp).
///
/// Per element of a parameter w with gradient g, at step t = 1, 2, ... and learning rate lr:
///   w = w - lr * weight_decay * w                        (only when the ParameterRef has decay)
///   m = beta1 m + (1 - beta1) g                          v = beta2 v + (1 - beta2) g^2
///   w = w - lr * m_hat / (sqrt(v_hat) + eps),            m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)
/// m and v start at 0 and so underestimate early on; the bias corrections divide that shrinkage out. The decay is
/// "decoupled": it shrinks w directly instead of adding weight_decay * w to g, so Adam's per-element scaling
/// does not weaken it for parameters with large gradients.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/train/parameters.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace selfattn {

/// \brief Hyperparameters of AdamW, PyTorch's defaults. The learning rate is given to each step (schedules).
struct AdamWConfig {
  double beta1 = 0.9;           ///< decay of the first moment (mean of g), in [0, 1)
  double beta2 = 0.999;         ///< decay of the second moment (mean of g^2), in [0, 1)
  double eps = 1e-8;            ///< added to sqrt(v_hat), > 0
  double weight_decay = 0.01;   ///< decoupled decay rate (multiplied by lr), >= 0; applies where ParameterRef::decay
};

/// \brief The AdamW optimizer: per-element moments for a fixed list of parameters, matched by position.
///
/// The first step sizes the moments from the list; every later step must pass a list of the same length with the
/// same sizes and names (std::invalid_argument naming the parameter otherwise, before anything is updated).
/// Moments are kept in T, as PyTorch keeps them in the parameter's dtype; the update is computed in double.
/// \code
/// AdamWConfig cfg;
/// cfg.weight_decay = 0.1;
/// AdamW<float> adamw(cfg);
/// for (Index step = 0; step < steps; ++step) {
///   // forward, backward, then the list of parameters and gradients (train/parameters.hpp)
///   adamw.step(params, schedule.learning_rate(step));
/// }
/// \endcode
template <typename T>
class AdamW {
 public:
  /// std::invalid_argument naming the field of `config` that is out of range.
  explicit AdamW(const AdamWConfig& config = {}) : config_(config) {
    const char* fn = "AdamW";
    const auto in_unit = [](double b) { return b >= 0.0 && b < 1.0; };
    if (!in_unit(config.beta1)) detail::throw_invalid(fn, "config.beta1", "expected [0, 1), got " + std::to_string(config.beta1));
    if (!in_unit(config.beta2)) detail::throw_invalid(fn, "config.beta2", "expected [0, 1), got " + std::to_string(config.beta2));
    if (!(config.eps > 0) || !std::isfinite(config.eps))
      detail::throw_invalid(fn, "config.eps", "expected a finite number > 0, got " + std::to_string(config.eps));
    if (!(config.weight_decay >= 0) || !std::isfinite(config.weight_decay))
      detail::throw_invalid(fn, "config.weight_decay",
                            "expected a finite number >= 0, got " + std::to_string(config.weight_decay));
  }

  const AdamWConfig& config() const { return config_; }  ///< the hyperparameters
  Index steps() const { return steps_; }                 ///< t: steps taken so far

  /// \brief One update of every parameter in `params` with learning rate `lr` (finite, >= 0), from its gradient.
  void step(const std::vector<ParameterRef<T>>& params, double lr) {
    check(params, lr);
    if (first_.empty()) {
      for (const ParameterRef<T>& p : params) {
        first_.emplace_back(static_cast<std::size_t>(p.size), T(0));
        second_.emplace_back(static_cast<std::size_t>(p.size), T(0));
        names_.push_back(p.name);
      }
    }
    ++steps_;
    const double b1 = config_.beta1, b2 = config_.beta2;
    const double c1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
    const double c2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
    const double step_size = lr / c1, root_c2 = std::sqrt(c2);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const ParameterRef<T>& p = params[i];
      T* m = first_[i].data();
      T* v = second_[i].data();
      const double shrink = p.decay ? 1.0 - lr * config_.weight_decay : 1.0;
      for (Index n = 0; n < p.size; ++n) {
        const double g = static_cast<double>(p.grad[n]);
        const double mn = b1 * static_cast<double>(m[n]) + (1.0 - b1) * g;  // m = b1 m + (1 - b1) g
        const double vn = b2 * static_cast<double>(v[n]) + (1.0 - b2) * g * g;  // v = b2 v + (1 - b2) g^2
        m[n] = static_cast<T>(mn);
        v[n] = static_cast<T>(vn);
        // w = w (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), written as PyTorch does:
        // (lr / c1) m / (sqrt(v) / sqrt(c2) + eps)
        const double w = static_cast<double>(p.value[n]) * shrink;
        p.value[n] = static_cast<T>(w - step_size * mn / (std::sqrt(vn) / root_c2 + config_.eps));
      }
    }
  }

  /// The first moments (m) of parameter i, in the order of the list; empty before the first step.
  const std::vector<T>& first_moment(std::size_t i) const { return first_.at(i); }
  /// The second moments (v) of parameter i, in the order of the list; empty before the first step.
  const std::vector<T>& second_moment(std::size_t i) const { return second_.at(i); }

 private:
  void check(const std::vector<ParameterRef<T>>& params, double lr) const {
    const char* fn = "AdamW::step";
    if (!(lr >= 0) || !std::isfinite(lr))
      detail::throw_invalid(fn, "lr", "expected a finite number >= 0, got " + std::to_string(lr));
    for (const ParameterRef<T>& p : params)
      if (p.size < 0 || (p.size > 0 && (p.value == nullptr || p.grad == nullptr)))
        detail::throw_invalid(fn, "params", "'" + p.name + "' has a negative size or a null value or gradient");
    if (first_.empty()) return;
    if (params.size() != first_.size())
      detail::throw_invalid(fn, "params",
                            "expected the " + std::to_string(first_.size()) + " parameters of the first step, got " +
                                std::to_string(params.size()));
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].name != names_[i] || static_cast<std::size_t>(params[i].size) != first_[i].size())
        detail::throw_invalid(fn, "params[" + std::to_string(i) + "]",
                              "'" + params[i].name + "' of " + std::to_string(params[i].size) +
                                  " elements, the first step had '" + names_[i] + "' of " +
                                  std::to_string(first_[i].size()));
  }

  AdamWConfig config_;
  Index steps_ = 0;
  std::vector<std::vector<T>> first_, second_;  // m and v of each parameter
  std::vector<std::string> names_;              // of the first step's list, to check later lists against
};

}  // namespace selfattn
