/// \file
/// Colours of the pictures: the colour maps that values are drawn in (ColourMap), and the fixed colours
/// outside them, of masked cells (a hatch pattern), NaN cells and outlines.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace selfattn {

/// \brief Sequential colour maps of the heatmaps: the low end of the range first.
enum class ColourMap {
  blues,   ///< near white to dark blue (ColorBrewer "Blues"): zero weight reads as empty paper; the default
  viridis  ///< dark purple to yellow (matplotlib's viridis): perceptually uniform, readable in greyscale
};

namespace detail {

/// A colour, each channel in 0..255 (not rounded: colour_at interpolates).
struct Rgb {
  double r, g, b;  // 0..255
};

/// The colour of t in [0, 1] (clamped; NaN -> 0) on `map`: piecewise linear between nine samples.
inline Rgb colour_at(ColourMap map, double t) {
  // ColorBrewer Blues (9 classes) and matplotlib viridis sampled at 0, 1/8, ..., 1.
  static constexpr unsigned blues[9] = {0xf7fbff, 0xdeebf7, 0xc6dbef, 0x9ecae1, 0x6baed6,
                                        0x4292c6, 0x2171b5, 0x08519c, 0x08306b};
  static constexpr unsigned viridis[9] = {0x440154, 0x472d7b, 0x3b528b, 0x2c728e, 0x21918c,
                                          0x28ae80, 0x5ec962, 0xaddc30, 0xfde725};
  const unsigned* samples = map == ColourMap::viridis ? viridis : blues;
  const double x = (std::isnan(t) ? 0.0 : std::clamp(t, 0.0, 1.0)) * 8.0;
  const int k = std::min(static_cast<int>(x), 7);
  const double f = x - k;
  const auto channel = [&](int shift) {
    const double a = (samples[k] >> shift) & 0xFF, b = (samples[k + 1] >> shift) & 0xFF;
    return a + f * (b - a);
  };
  return {channel(16), channel(8), channel(0)};
}

/// `c` as "#rrggbb".
inline std::string hex_colour(const Rgb& c) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", static_cast<int>(std::lround(c.r)),
                static_cast<int>(std::lround(c.g)), static_cast<int>(std::lround(c.b)));
  return text;
}

/// True when dark text is the readable one on `c` (perceived lightness, Rec. 709 weights, above ~0.55).
inline bool is_light(const Rgb& c) { return (0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b) / 255.0 > 0.55; }

/// The hatch of masked cells, for the SVG's `<defs>`: light grey with darker diagonal lines.
inline constexpr const char* masked_pattern =
    "<pattern id=\"selfattn-masked\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
    "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f0f0f0\"/>"
    "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bdbdbd\" stroke-width=\"2\"/></pattern>\n";
inline constexpr const char* masked_fill = "url(#selfattn-masked)";  // hatched light grey: masked_pattern
inline constexpr const char* nan_fill = "#fcd5d5";                   // pale red: no colour map starts or ends there
inline constexpr const char* nan_text = "#b2182b";                   // "NaN" written in a NaN cell
inline constexpr const char* outline_colour = "#d62728";             // the frame of outlined rows and columns

}  // namespace detail
}  // namespace selfattn
