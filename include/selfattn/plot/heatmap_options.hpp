/// \file
/// HeatmapOptions, the options of every SVG heatmap function, and their validation.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/plot/colour_map.hpp>
#include <selfattn/plot/text.hpp>
#include <selfattn/tensor.hpp>

#include <cmath>
#include <string>

namespace selfattn {

/// \brief Options of every SVG heatmap function. Every field has a default.
///
/// \code
/// HeatmapOptions opts;
/// opts.title = "layer 0, head 3";
/// opts.cell_size = 32;          // px
/// opts.show_values = false;     // colours only
/// opts.colour_map = ColourMap::viridis;
/// opts.zero_is_masked = true;   // weights of a causal forward: exact zeros are the masked keys
/// std::string svg = attention_heatmap_svg(weights, words, words, opts);
/// \endcode
struct HeatmapOptions {
  std::string title;                        ///< drawn in bold above everything; empty: none
  double cell_size = 40.0;                  ///< side of one cell in px, in [8, 400]
  bool show_values = true;                  ///< print each value in its cell (only where it fits)
  int decimals = 2;                         ///< digits after the point of the printed values, in [0, 6]
  ColourMap colour_map = ColourMap::blues;  ///< the colours of the values
  double colour_min = 0.0;                  ///< value drawn in the first colour; lower values are clamped to it
  double colour_max = 1.0;                  ///< value drawn in the last colour; higher values are clamped to it
  bool auto_range = false;                  ///< colour range = [min, max] of the finite, unmasked values instead
  /// Draw an exact 0 as masked: a masked forward gives its masked keys exactly 0.
  bool zero_is_masked = false;
  /// Empty, or a mask broadcastable to (B, H, Lq, Lk) (to (1, 1, Lq, Lk) for a matrix); false = masked.
  TensorView<const bool, 4> allowed;
  std::string legend_label = "weight";  ///< the name above the colour scale
  Index grid_columns = 0;               ///< panels (heads) per row of a grid; 0 = ceil(sqrt(number of panels))
};

namespace detail {

/// std::invalid_argument naming the first field of `o` out of its range.
inline void validate_heatmap_options(const char* function, const HeatmapOptions& o) {
  if (!(o.cell_size >= 8.0 && o.cell_size <= 400.0))
    throw_invalid(function, "options.cell_size",
                  "expected a size in px in [8, 400], got " + fixed_string(o.cell_size, 3));
  if (o.decimals < 0 || o.decimals > 6)
    throw_invalid(function, "options.decimals", "expected 0 to 6 digits, got " + std::to_string(o.decimals));
  if (!o.auto_range && !(std::isfinite(o.colour_min) && std::isfinite(o.colour_max) && o.colour_min < o.colour_max))
    throw_invalid(function, "options.colour_min",
                  "expected finite colour_min < colour_max, got [" + fixed_string(o.colour_min, 6) + ", " +
                      fixed_string(o.colour_max, 6) + "] (or set auto_range)");
  if (o.grid_columns < 0)
    throw_invalid(function, "options.grid_columns",
                  "expected 0 (automatic) or a positive count, got " + std::to_string(o.grid_columns));
}

}  // namespace detail
}  // namespace selfattn
