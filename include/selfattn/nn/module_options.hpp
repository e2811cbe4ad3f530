/// \file
/// The options of AttentionOptions that a module decides itself, checked so that none is silently ignored.
///
/// `sdpa_forward` honours every field of AttentionOptions. The modules (MultiHeadAttention, TransformerLayer,
/// TransformerStack) set some of them themselves: the dropout rate is the configuration's (cfg.dropout, in training
/// mode only), and `step` always attends with Causal::bottom_right, without dropout and without weights. A field a
/// call would override is accepted only at its default or at exactly the value the call uses; anything else throws
/// std::invalid_argument naming the option, the value given and the value the call uses, before any work.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/options.hpp>

#include <string>

namespace selfattn::detail {

/// A module's forward: its dropout rate is `rate` (the configuration field `rate_name`), applied in training mode
/// only. opts.dropout_p may be 0 (the default: "not set") or that rate; any other value would be ignored.
template <typename T>
void check_module_dropout(const char* function, const AttentionOptions<T>& opts, double rate, const char* rate_name,
                          bool training) {
  const T configured = static_cast<T>(rate);
  if (opts.dropout_p == T(0) || opts.dropout_p == configured) return;
  throw_invalid(function, "opts.dropout_p",
                std::string("the module applies its own rate, ") + rate_name + " = " + std::to_string(configured) +
                    ", in training mode only (this call: " + std::to_string(training ? configured : T(0)) +
                    "); expected 0 or " + std::to_string(configured) + ", got " + std::to_string(opts.dropout_p));
}

/// A module's step: it attends with Causal::bottom_right over the cache (Causal::none, the default, means the same
/// there), applies no dropout and returns no weights. Causal::top_left is refused rather than read as bottom_right:
/// the two differ as soon as the cache holds earlier tokens.
template <typename T>
void check_step_options(const char* function, const AttentionOptions<T>& opts) {
  if (opts.need_weights)
    throw_invalid(function, "opts.need_weights", "step returns no weights (use forward); expected false, got true");
  if (opts.causal == Causal::top_left)
    throw_invalid(function, "opts.causal",
                  "step attends with Causal::bottom_right over the cache; expected Causal::none or "
                  "Causal::bottom_right, got Causal::top_left");
  if (opts.dropout_p != T(0))
    throw_invalid(function, "opts.dropout_p",
                  "step applies no dropout (this call: 0); expected 0, got " + std::to_string(opts.dropout_p));
}

}  // namespace selfattn::detail
