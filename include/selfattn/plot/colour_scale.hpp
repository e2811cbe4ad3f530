/// \file
/// The colour scale of a picture: the range of values its colours span (fixed, or the extremes of the
/// values), and the legend beside the panels that shows it: a bar with tick values, and swatches for the
/// masked and NaN cells when there are any.
#pragma once

#include <selfattn/plot/colour_map.hpp>
#include <selfattn/plot/heatmap_options.hpp>
#include <selfattn/plot/panel.hpp>
#include <selfattn/plot/text.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace selfattn {
namespace detail {

/// The values the colours span, and which cells other than colours the legend must explain.
struct ColourRange {
  double lo = 0, hi = 1;                     // values drawn in the first and the last colour
  bool any_masked = false, any_nan = false;  // a masked cell; a NaN cell that is not masked

  /// The position of `value` in the range, 0 at lo and 1 at hi (not clamped: colour_at clamps).
  double position(double value) const { return (value - lo) / (hi - lo); }
};

/// The colour range of `panels`: `o.colour_min` to `o.colour_max`, or with `o.auto_range` the finite
/// unmasked extremes (a constant matrix gets a unit-wide range around its value, no finite value [0, 1]).
inline ColourRange colour_range(const std::vector<HeatmapPanel>& panels, const HeatmapOptions& o) {
  double lo = o.colour_min, hi = o.colour_max;
  bool any_masked = false, any_nan = false;
  if (o.auto_range) {
    lo = std::numeric_limits<double>::infinity();
    hi = -lo;
  }
  for (const HeatmapPanel& p : panels)
    for (std::size_t n = 0; n < p.values.size(); ++n) {
      const bool masked = !p.masked.empty() && p.masked[n];
      any_masked |= masked;
      any_nan |= !masked && std::isnan(p.values[n]);
      if (o.auto_range && !masked && std::isfinite(p.values[n])) {
        lo = std::min(lo, p.values[n]);
        hi = std::max(hi, p.values[n]);
      }
    }
  if (o.auto_range && !(lo <= hi)) {  // no finite value at all
    lo = 0.0;
    hi = 1.0;
  } else if (o.auto_range && lo == hi) {  // a constant matrix: its one colour mid-scale
    lo -= 0.5;
    hi += 0.5;
  }
  return {lo, hi, any_masked, any_nan};
}

/// The `<linearGradient>` the legend's bar is filled with, for the SVG's `<defs>`: `map`, low end at the bottom.
inline std::string scale_gradient(ColourMap map) {
  std::string out = "<linearGradient id=\"selfattn-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int k = 0; k <= 8; ++k)
    out += "<stop offset=\"" + px(k / 8.0) + "\" stop-color=\"" + hex_colour(colour_at(map, k / 8.0)) + "\"/>";
  return out + "</linearGradient>\n";
}

/// Sizes of the legend, in px: its label, a vertical bar (maximum at the top) with five ticks, then the swatches.
struct Legend {
  double bar_w = 16, bar_h = 0, tick_font = 11;
  std::vector<std::string> ticks;  // the five tick values, lo first
  double width = 0, height = 0;
};

/// The legend of `range` under the name `label`, its bar 60% of `panels_height` (within [120, 240] px).
inline Legend layout_legend(const ColourRange& range, const std::string& label, double panels_height) {
  Legend l;
  const double lo = range.lo, hi = range.hi;
  l.bar_h = std::clamp(panels_height * 0.6, 120.0, 240.0);
  for (int k = 0; k <= 4; ++k) {
    const double value = lo + (hi - lo) * k / 4.0;
    const double shown = std::abs(value) < 1e-12 * (hi - lo) ? 0.0 : value;  // no "1.39e-17" for a zero tick
    char text[64];
    const std::to_chars_result r = std::to_chars(text, text + sizeof text, shown, std::chars_format::general, 3);
    l.ticks.emplace_back(text, r.ptr);
  }
  l.width = std::max(text_width(label, 11.0), 24.0);
  for (const std::string& tick : l.ticks) l.width = std::max(l.width, l.bar_w + 10 + text_width(tick, l.tick_font));
  if (range.any_masked || range.any_nan) l.width = std::max(l.width, 14 + 6 + text_width("masked", l.tick_font));
  l.height = 24 + l.bar_h + (range.any_masked ? 24.0 : 0.0) + (range.any_nan ? 24.0 : 0.0) + 8;
  return l;
}

/// Draws legend `l` of `range` with its top-left corner at (x, y): the label, the bar filled with
/// scale_gradient (lo at the bottom, hi at the top), the tick values, then the swatches.
inline void draw_legend(std::string& out, const Legend& l, const ColourRange& range, const std::string& label,
                        double x, double y) {
  out += "<g class=\"legend\">\n";
  svg_text(out, x, y + 11, 11, "fill=\"#333333\"", label);
  const double bar_y = y + 24;
  out += "<rect class=\"scale\" x=\"" + px(x) + "\" y=\"" + px(bar_y) + "\" width=\"" + px(l.bar_w) +
         "\" height=\"" + px(l.bar_h) + "\" fill=\"url(#selfattn-scale)\" stroke=\"#888888\" stroke-width=\"0.5\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double ty = bar_y + l.bar_h * (1.0 - k / 4.0);
    out += "<line x1=\"" + px(x + l.bar_w) + "\" y1=\"" + px(ty) + "\" x2=\"" + px(x + l.bar_w + 4) + "\" y2=\"" +
           px(ty) + "\" stroke=\"#888888\"/>\n";
    svg_text(out, x + l.bar_w + 7, ty + l.tick_font * 0.35, l.tick_font, "class=\"tick\" fill=\"#333333\"",
             l.ticks[static_cast<std::size_t>(k)]);
  }
  double sy = bar_y + l.bar_h + 12;
  const auto swatch = [&](const std::string& fill, const std::string& name) {
    out += "<rect class=\"swatch\" x=\"" + px(x) + "\" y=\"" + px(sy) + "\" width=\"14\" height=\"14\" fill=\"" + fill +
           "\" stroke=\"#888888\" stroke-width=\"0.5\"/>\n";
    svg_text(out, x + 20, sy + 11, l.tick_font, "fill=\"#333333\"", name);
    sy += 24;
  };
  if (range.any_masked) swatch(masked_fill, "masked");
  if (range.any_nan) swatch(nan_fill, "NaN");
  out += "</g>\n";
}

}  // namespace detail
}  // namespace selfattn
