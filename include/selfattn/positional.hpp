/// \file
/// Position information for attention: the sinusoidal encoding (added to
/// token embeddings), ALiBi slopes (a per-head linear penalty on the scores) and rotary embeddings
/// (RoPE: q and k rotated in place by an angle proportional to their position).
///
/// Dimension letters: B batch, H heads, L length (rows), D head dim, E embed dim. Formulas, examples
/// and the positions the attention module uses are in docs/positional.md.
///
/// Angles are computed in double and only the final cos / sin (or encoding value) is cast to T: a
/// float angle at position 10^5 would already be off by ~4e-3 rad, a double one by ~1e-11.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {

// ---- Sinusoidal encoding -------------------------------------------------------------------------

/// \brief The fixed sinusoidal position encoding of Vaswani et al. (2017), to be added to token embeddings.
///
/// Shapes: L positions, E embed dim (even, >= 2).
/// \code
///   returns (L, E):   pe[p, 2i]     = sin(p / 10000^(2i/E))
///                     pe[p, 2i + 1] = cos(p / 10000^(2i/E))      for i = 0 .. E/2 - 1
///
/// Tensor<float, 2> pe = sinusoidal_encoding<float>(128, 512);   // row p goes to the token at position p
/// \endcode
/// Throws std::invalid_argument naming `length` if L < 0 and `embed_dim` if E is odd or < 2.
template <typename T>
Tensor<T, 2> sinusoidal_encoding(Index length, Index embed_dim) {
  static_assert(std::is_floating_point_v<T>, "sinusoidal_encoding: T must be float or double");
  constexpr const char* function = "sinusoidal_encoding";
  if (length < 0) detail::throw_invalid(function, "length", "expected >= 0, got " + std::to_string(length));
  // Even, because sin and cos come in pairs that share one frequency.
  if (embed_dim < 2 || embed_dim % 2 != 0)
    detail::throw_invalid(function, "embed_dim", "expected an even number >= 2, got " + std::to_string(embed_dim));

  Tensor<T, 2> pe({length, embed_dim});
  T* out = pe.data();
  for (Index i = 0; i < embed_dim / 2; ++i) {
    // 10000^(2i/E): wavelengths from 2*pi (i = 0) up to 10000 * 2*pi, geometrically spaced.
    const double wavelength = std::pow(10000.0, static_cast<double>(2 * i) / static_cast<double>(embed_dim));
    for (Index p = 0; p < length; ++p) {
      const double angle = static_cast<double>(p) / wavelength;
      out[p * embed_dim + 2 * i] = static_cast<T>(std::sin(angle));
      out[p * embed_dim + 2 * i + 1] = static_cast<T>(std::cos(angle));
    }
  }
  return pe;
}

// ---- ALiBi slopes --------------------------------------------------------------------------------

/// \brief The per-head slopes of ALiBi (Press et al., 2022): head h adds `-slope[h] * |distance|` to its scores.
///
/// Shapes: H heads (>= 1); returns H slopes, for `AttentionOptions::alibi_slopes`.
/// \code
///   H a power of two:   slope[h] = 2^(-8 (h+1) / H)                 for h = 0 .. H-1
///   otherwise, with n the largest power of two below H:
///     slope[h]     = 2^(-8 (h+1) / n)                                 for h = 0 .. n-1
///     slope[n + k] = 2^(-8 (2k+1) / (2n))  (slopes of 2n heads at indices 0, 2, 4, ...)   for k = 0 .. H-n-1
///
/// std::vector<float> s = alibi_slopes<float>(8);    // 1/2, 1/4, ..., 1/256
/// std::vector<float> t = alibi_slopes<float>(6);    // 2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3
/// \endcode
/// Throws std::invalid_argument naming `num_heads` if H < 1.
template <typename T>
std::vector<T> alibi_slopes(Index num_heads) {
  static_assert(std::is_floating_point_v<T>, "alibi_slopes: T must be float or double");
  if (num_heads < 1)
    detail::throw_invalid("alibi_slopes", "num_heads", "expected >= 1, got " + std::to_string(num_heads));

  // n = largest power of two <= H (written so that doubling never overflows).
  Index n = 1;
  while (n <= num_heads / 2) n *= 2;

  std::vector<T> slopes;
  slopes.reserve(static_cast<std::size_t>(num_heads));
  // The geometric sequence the paper tuned for n heads: ratio and start both 2^(-8/n).
  for (Index h = 0; h < n; ++h)
    slopes.push_back(static_cast<T>(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n))));
  // The paper's rule for the rest: every other slope of the 2n-head sequence, i.e. the ones that fall
  // halfway (in log scale) between the slopes above. H - n < n, so index 2k stays below 2n.
  for (Index k = 0; k < num_heads - n; ++k)
    slopes.push_back(static_cast<T>(std::exp2(-8.0 * static_cast<double>(2 * k + 1) / static_cast<double>(2 * n))));
  return slopes;
}

// ---- Rotary embedding ----------------------------------------------------------------------------

/// \brief Which entries of a head vector RoPE rotates together.
///
/// \code
/// RopeStyle::half          pairs (x[i], x[i + dim/2])   GPT-NeoX, Llama
/// RopeStyle::interleaved   pairs (x[2i], x[2i + 1])     GPT-J, RoFormer
/// \endcode
enum class RopeStyle {
  half,        ///< pairs (x[i], x[i + dim/2]): GPT-NeoX, Llama
  interleaved  ///< pairs (x[2i], x[2i + 1]): GPT-J, RoFormer
};

/// \brief Rotary position embedding (Su et al., RoFormer): rotates pairs of q/k entries by an angle
/// proportional to the position, so that q_m . k_n depends on positions only through m - n.
///
/// Shapes: x is (B, H, L, D) with D >= dim; the first `dim` entries of each row are rotated (the rest,
/// if any, are left untouched: partial rotary). Row l of batch b is at position `offset_b + l`.
/// \code
///   theta_i = base^(-2i/dim),  i = 0 .. dim/2 - 1;   angle = position * theta_i
///   (a, b) -> (a cos(angle) - b sin(angle),  a sin(angle) + b cos(angle))   for each pair (a, b) of RopeStyle
///
/// RotaryEmbedding<float> rope(64);                  // dim 64, base 10000, RopeStyle::half
/// rope.apply(q, cache_length);                      // q (B, H, Lnew, 64): positions cache_length + l
/// rope.apply_inverse(dq, cache_length);             // rotate a gradient back (R^T = R(-angle))
/// \endcode
/// The object holds only dim, base, style and the dim/2 frequencies: it is cheap to copy, and its
/// const member functions may be called from many threads at once.
template <typename T>
class RotaryEmbedding {
  static_assert(std::is_floating_point_v<T>, "RotaryEmbedding: T must be float or double");

 public:
  /// Rotates the first `dim` entries of each row with frequencies base^(-2i/dim), paired as `style` says.
  /// Throws std::invalid_argument naming `dim` (odd or < 2) or `base` (not finite or <= 0).
  explicit RotaryEmbedding(Index dim, T base = T(10000), RopeStyle style = RopeStyle::half)
      : dim_(dim), base_(base), style_(style) {
    constexpr const char* function = "RotaryEmbedding";
    if (dim < 2 || dim % 2 != 0)
      detail::throw_invalid(function, "dim", "expected an even number >= 2, got " + std::to_string(dim));
    if (!std::isfinite(base) || !(base > T(0)))
      detail::throw_invalid(function, "base", "expected a finite number > 0, got " + std::to_string(base));
    // theta_i = base^(-2i/dim), kept in double so that position * theta_i is accurate at long positions.
    inv_freq_.resize(static_cast<std::size_t>(dim / 2));
    for (Index i = 0; i < dim / 2; ++i)
      inv_freq_[static_cast<std::size_t>(i)] =
          std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(dim));
  }

  /// Number of rotated entries at the start of each row (even).
  Index dim() const { return dim_; }
  /// Frequency base: theta_i = base^(-2i/dim).
  T base() const { return base_; }
  /// Pairing of the rotated entries.
  RopeStyle style() const { return style_; }

  /// Rotates x (B, H, L, D), D >= dim, in place; row l is at position `position_offset + l` (any Index,
  /// negative too). Throws ShapeError naming `x` if D < dim.
  void apply(TensorView<T, 4> x, Index position_offset = 0) const {
    check_x("RotaryEmbedding::apply", x);
    rotate(x, [position_offset](Index) { return position_offset; }, +1.0);
  }
  /// \overload
  void apply(Tensor<T, 4>& x, Index position_offset = 0) const { apply(x.view(), position_offset); }

  /// Rotates x (B, H, L, D) in place with one offset per batch entry: row l of batch b is at position
  /// `position_offsets[b] + l` (a batch of sequences each at its own KV-cache length). Throws ShapeError
  /// naming `position_offsets` unless it has B entries.
  void apply(TensorView<T, 4> x, const std::vector<Index>& position_offsets) const {
    check_x("RotaryEmbedding::apply", x);
    check_offsets("RotaryEmbedding::apply", x, position_offsets);
    rotate(x, [&position_offsets](Index b) { return position_offsets[static_cast<std::size_t>(b)]; }, +1.0);
  }
  /// \overload
  void apply(Tensor<T, 4>& x, const std::vector<Index>& position_offsets) const { apply(x.view(), position_offsets); }

  /// The inverse of apply (every angle negated), in place: apply_inverse(apply(x)) == x up to rounding.
  /// Rotations are orthogonal, so the gradient of y = R x is dx = R^T dy = R(-angle) dy: this is what a
  /// backward pass calls on dq and dk.
  void apply_inverse(TensorView<T, 4> x, Index position_offset = 0) const {
    check_x("RotaryEmbedding::apply_inverse", x);
    rotate(x, [position_offset](Index) { return position_offset; }, -1.0);
  }
  /// \overload
  void apply_inverse(Tensor<T, 4>& x, Index position_offset = 0) const { apply_inverse(x.view(), position_offset); }

  /// apply_inverse with one offset per batch entry (see the matching apply).
  void apply_inverse(TensorView<T, 4> x, const std::vector<Index>& position_offsets) const {
    check_x("RotaryEmbedding::apply_inverse", x);
    check_offsets("RotaryEmbedding::apply_inverse", x, position_offsets);
    rotate(x, [&position_offsets](Index b) { return position_offsets[static_cast<std::size_t>(b)]; }, -1.0);
  }
  /// \overload
  void apply_inverse(Tensor<T, 4>& x, const std::vector<Index>& position_offsets) const {
    apply_inverse(x.view(), position_offsets);
  }

 private:
  void check_x(const char* function, const TensorView<T, 4>& x) const {
    if (x.dim(3) < dim_)
      detail::throw_shape_error(function, "x",
                                "expected shape (*, *, *, D) with D >= dim = " + std::to_string(dim_) + ", got " +
                                    detail::expected_shape_string(x.shape()));
    // In place: an element reachable by two indices would be rotated twice.
    if (detail::overlaps_itself(x))
      detail::throw_invalid(function, "x",
                            "the view's elements overlap in memory (strides " + detail::shape_string<4>(x.strides()) +
                                "), so an in-place rotation would rotate some twice");
  }

  static void check_offsets(const char* function, const TensorView<T, 4>& x, const std::vector<Index>& offsets) {
    if (static_cast<Index>(offsets.size()) != x.dim(0))
      detail::throw_shape_error(function, "position_offsets",
                                "expected " + std::to_string(x.dim(0)) + " entries (one per batch entry of x " +
                                    detail::expected_shape_string(x.shape()) + "), got " +
                                    std::to_string(offsets.size()));
  }

  // The one kernel: rotates every pair by sign * position * theta_i, position = offset_of(b) + l.
  // sign = -1 gives the exact transpose: cos is even and the sine is negated exactly, so
  // apply_inverse uses bit for bit the same matrix entries as apply.
  template <typename OffsetOf>
  void rotate(const TensorView<T, 4>& x, OffsetOf offset_of, double sign) const {
    if (x.empty()) return;
    const Index half = dim_ / 2;
    // Pair i is (row[i * step], row[i * step + partner]); only this index map differs between the styles.
    const Index step = style_ == RopeStyle::half ? 1 : 2;
    const Index partner = style_ == RopeStyle::half ? half : 1;
    // cos / sin of one position, shared by all H heads of that row: on the stack up to 256 pairs (a head dim of
    // 512), so that a decoding step's rotation allocates nothing; on the heap beyond.
    constexpr Index stack_pairs = 256;
    std::array<T, stack_pairs> cos_stack, sin_stack;
    std::vector<T> cos_heap, sin_heap;
    if (half > stack_pairs) {
      cos_heap.resize(static_cast<std::size_t>(half));
      sin_heap.resize(static_cast<std::size_t>(half));
    }
    T* const cos_table = half > stack_pairs ? cos_heap.data() : cos_stack.data();
    T* const sin_table = half > stack_pairs ? sin_heap.data() : sin_stack.data();
    for (Index b = 0; b < x.dim(0); ++b) {
      const Index offset = offset_of(b);
      for (Index l = 0; l < x.dim(2); ++l) {
        // Added in double: offset + l cannot overflow, and any position below 2^53 is exact.
        const double position = static_cast<double>(offset) + static_cast<double>(l);
        for (Index i = 0; i < half; ++i) {
          const double angle = position * inv_freq_[static_cast<std::size_t>(i)];
          cos_table[i] = static_cast<T>(std::cos(angle));
          sin_table[i] = static_cast<T>(sign * std::sin(angle));
        }
        for (Index h = 0; h < x.dim(1); ++h) {
          // Rows are contiguous (stride 1 in the last dimension); b, h, l strides are arbitrary.
          T* row = x.data() + b * x.stride(0) + h * x.stride(1) + l * x.stride(2);
          for (Index i = 0; i < half; ++i) {
            T& first = row[i * step];
            T& second = row[i * step + partner];
            const T u = first, v = second;
            const T c = cos_table[i], s = sin_table[i];
            // (u, v) -> (u cos - v sin, u sin + v cos)
            first = u * c - v * s;
            second = u * s + v * c;
          }
        }
      }
    }
  }

  Index dim_;
  T base_;
  RopeStyle style_;
  std::vector<double> inv_freq_;  // theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1
};

}  // namespace selfattn
