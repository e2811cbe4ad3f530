/// \file
/// Learning-rate schedules: the one of most transformer training runs today, a linear warmup then a cosine decay
/// (WarmupCosineSchedule), and the original Transformer's (NoamSchedule, below).
///
/// WarmupCosineSchedule:
///   step <  warmup:                lr = peak_lr (step + 1) / warmup_steps
///   warmup <= step < total:        lr = min_lr + (peak_lr - min_lr) (1 + cos(pi progress)) / 2,
///                                  progress = (step - warmup_steps) / (total_steps - warmup_steps)
///   step >= total:                 lr = min_lr
/// Steps count from 0. The warmup keeps the first updates small while Adam's second moments are still noisy;
/// the cosine spends most of the run near the peak and settles slowly at the end.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace selfattn {

/// \brief Linear warmup from 0 to peak_lr over warmup_steps, then cosine decay to min_lr at total_steps.
/// \code
/// WarmupCosineSchedule schedule;
/// schedule.peak_lr = 3e-3;
/// schedule.min_lr = 3e-4;
/// schedule.warmup_steps = 50;
/// schedule.total_steps = 1000;
/// double lr = schedule.learning_rate(step);   // step = 0, 1, ...
/// \endcode
struct WarmupCosineSchedule {
  double peak_lr = 1e-3;    ///< the rate at the end of the warmup (finite, >= min_lr)
  double min_lr = 0.0;      ///< the rate at total_steps and after (finite, >= 0)
  Index warmup_steps = 0;   ///< steps of linear warmup (>= 0)
  Index total_steps = 1;    ///< the step at which the decay ends (>= warmup_steps)

  /// The learning rate of step `step` (>= 0). std::invalid_argument naming the field out of range, or `step`.
  double learning_rate(Index step) const {
    const char* fn = "WarmupCosineSchedule::learning_rate";
    if (!(min_lr >= 0) || !std::isfinite(min_lr))
      detail::throw_invalid(fn, "min_lr", "expected a finite number >= 0, got " + std::to_string(min_lr));
    if (!(peak_lr >= min_lr) || !std::isfinite(peak_lr))
      detail::throw_invalid(fn, "peak_lr", "expected a finite number >= min_lr, got " + std::to_string(peak_lr));
    if (warmup_steps < 0)
      detail::throw_invalid(fn, "warmup_steps", "expected >= 0, got " + std::to_string(warmup_steps));
    if (total_steps < warmup_steps)
      detail::throw_invalid(fn, "total_steps",
                            "expected >= warmup_steps (" + std::to_string(warmup_steps) + "), got " +
                                std::to_string(total_steps));
    if (step < 0) detail::throw_invalid(fn, "step", "expected >= 0, got " + std::to_string(step));
    if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (step >= total_steps) return min_lr;
    const double progress =
        static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    const double pi = 3.14159265358979323846;
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(pi * progress));
  }
};

/// \brief The original Transformer's schedule (Vaswani et al. 2017, "Noam"): a linear warmup, then a decay as the
/// inverse square root of the step, scaled by model_dim^-0.5.
///
///   lr = factor * model_dim^-0.5 * min(t^-0.5, t * warmup_steps^-1.5),   t = step + 1 (steps count from 0)
///
/// It peaks at t = warmup_steps, at factor / sqrt(model_dim * warmup_steps), and never reaches zero: halving needs
/// four times the steps. The paper used model_dim = 512, warmup_steps = 4000, factor 1 (peak 7.0e-4).
/// \code
/// NoamSchedule schedule;
/// schedule.model_dim = 512;
/// schedule.warmup_steps = 4000;
/// double lr = schedule.learning_rate(step);   // step = 0, 1, ...
/// \endcode
struct NoamSchedule {
  Index model_dim = 512;      ///< d_model, the scale of the rate (>= 1)
  Index warmup_steps = 4000;  ///< steps of linear warmup (>= 1)
  double factor = 1.0;        ///< a multiplier of the whole schedule (finite, > 0)

  /// The learning rate of step `step` (>= 0). std::invalid_argument naming the field out of range, or `step`.
  double learning_rate(Index step) const {
    const char* fn = "NoamSchedule::learning_rate";
    if (model_dim < 1) detail::throw_invalid(fn, "model_dim", "expected >= 1, got " + std::to_string(model_dim));
    if (warmup_steps < 1)
      detail::throw_invalid(fn, "warmup_steps", "expected >= 1, got " + std::to_string(warmup_steps));
    if (!(factor > 0) || !std::isfinite(factor))
      detail::throw_invalid(fn, "factor", "expected a finite number > 0, got " + std::to_string(factor));
    if (step < 0) detail::throw_invalid(fn, "step", "expected >= 0, got " + std::to_string(step));
    const double t = static_cast<double>(step) + 1, warmup = static_cast<double>(warmup_steps);
    // min(t^-0.5, t warmup^-1.5): the warmup's line and the decay's curve meet at t = warmup
    return factor / std::sqrt(static_cast<double>(model_dim)) *
           std::min(1 / std::sqrt(t), t / (warmup * std::sqrt(warmup)));
  }
};

}  // namespace selfattn
