/// \file
/// The learning-rate schedule of most transformer training runs: a linear warmup, then a cosine decay.
///
///   step <  warmup:                lr = peak_lr (step + 1) / warmup_steps
///   warmup <= step < total:        lr = min_lr + (peak_lr - min_lr) (1 + cos(pi progress)) / 2,
///                                  progress = (step - warmup_steps) / (total_steps - warmup_steps)
///   step >= total:                 lr = min_lr
/// Steps count from 0. The warmup keeps the first updates small while Adam's second moments are still noisy;
/// the cosine spends most of the run near the peak and settles slowly at the end.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

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

}  // namespace selfattn
