/// \file
/// Line charts as SVG: curves of y against x (a measure against depth, head dimension, training step), one
/// chart or several side by side under one title, with linear or logarithmic axes, tick marks and grid lines,
/// dotted reference lines, and one legend below the charts.
///
/// Same conventions as plot/heatmap.hpp: the SVG is self-contained, every label is XML-escaped (plot/text.hpp),
/// numbers are formatted with `std::to_chars` (no locale), `line_charts_svg` returns the text and
/// `write_line_charts_svg` writes it to a file (std::runtime_error naming the path when it cannot). Bad input
/// (no charts, a chart without series, x and y of different lengths, a non-finite value, a log axis without a
/// positive value, an axis range that is empty) throws std::invalid_argument naming the argument, e.g.
/// \code{.unparsed}
///   [line_charts_svg] charts[0].series[1].y: expected 33 values (as many as x), got 32
/// \endcode
/// Guide with pictures: docs/pictures.md.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/plot/heatmap.hpp>
#include <selfattn/plot/text.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

namespace selfattn {

/// How an axis maps values to positions.
enum class AxisScale {
  linear,  ///< equal distances for equal differences
  log      ///< equal distances for equal ratios; only values > 0 (others are drawn at the axis minimum)
};

/// \brief One axis of a LineChart: its name, scale, range and ticks. Every field has a default.
///
/// A range left as NaN comes from the data: on a linear axis it is widened to the next multiples of the tick
/// step, on a log axis to powers of ten. Ticks left empty are chosen (steps of 1, 2 or 5 times a power of ten;
/// powers of ten on a log axis). On a log axis whose ticks are all powers of ten the labels are written 10^k.
/// Values outside the range are drawn at its border.
/// \code
/// ChartAxis x;
/// x.label = "head dimension d";
/// x.scale = AxisScale::log;
/// x.ticks = {16, 32, 64, 128, 256, 512, 1024};  // labelled as written
/// \endcode
struct ChartAxis {
  std::string label;                                      ///< the axis name; empty: none
  AxisScale scale = AxisScale::linear;                    ///< linear or logarithmic
  double min = std::numeric_limits<double>::quiet_NaN();  ///< lower end; NaN: from the data
  double max = std::numeric_limits<double>::quiet_NaN();  ///< upper end; NaN: from the data
  std::vector<double> ticks;  ///< tick values (those in the range are drawn); empty: chosen
};

/// \brief One curve: points (x[i], y[i]) joined in the given order.
struct LineSeries {
  std::string label;       ///< its name in the legend; empty: not in the legend
  std::string colour;      ///< an SVG colour ("#1f77b4"); empty: the next colour of the palette (line_chart_palette)
  std::vector<double> x;   ///< x values, finite
  std::vector<double> y;   ///< y values, finite, as many as x
  bool markers = false;    ///< a dot at every point
  bool dashed = false;     ///< a dashed line instead of a solid one
};

/// \brief A dotted horizontal line across a chart, e.g. a bound or the rounding level.
struct ReferenceLine {
  double y = 0;       ///< where (drawn only when inside the y range)
  std::string label;  ///< written above the line at the right end; empty: none
};

/// \brief One chart: a title, two axes, its curves and reference lines.
///
/// \code
/// LineChart c;
/// c.title = "softmax entropy";
/// c.x = {"d", AxisScale::log};
/// c.y.label = "mean entropy (nats)";
/// c.series.push_back({"scaled by 1/sqrt(d)", "#1f77b4", ds, scaled});
/// c.series.push_back({"unscaled", "#d62728", ds, unscaled});
/// c.references.push_back({std::log(64.0), "log n"});
/// \endcode
struct LineChart {
  std::string title;                     ///< drawn in bold above the chart; empty: none
  ChartAxis x;                           ///< horizontal axis
  ChartAxis y;                           ///< vertical axis
  std::vector<LineSeries> series;        ///< at least one curve
  std::vector<ReferenceLine> references;  ///< dotted horizontal lines
};

/// \brief Options of a picture of line charts. Every field has a default.
struct LineChartOptions {
  std::string title;            ///< drawn in bold above the charts; empty: none
  double plot_width = 360;      ///< width of one chart's plotting area in px, in [80, 2000]
  double plot_height = 240;     ///< height of one chart's plotting area in px, in [60, 2000]
  Index charts_per_row = 0;     ///< charts side by side before the next row starts; 0: all in one row
  bool legend = true;           ///< one legend below the charts: each labelled series once (by label)
};

/// The colours given to series without one, in order: matplotlib's "tab10" (blue, orange, green, red, ...).
inline const std::array<const char*, 10>& line_chart_palette() {
  static const std::array<const char*, 10> palette{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return palette;
}

namespace detail {

/// Geometry of one chart in px: room left of, above and below its plotting area, and between charts.
inline constexpr double chart_left = 66, chart_top = 30, chart_bottom = 48, chart_gap = 24;
/// The picture's margin, its title's height, and the height of one legend row.
inline constexpr double chart_margin = 14, chart_title_height = 30, chart_legend_row = 20;

/// `value` with at most `digits` significant digits, as printf's %g but without the locale ("0.2", "1e-05").
inline std::string general_string(double value, int digits = 6) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const std::to_chars_result r =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::general, digits);
  return r.ec == std::errc() ? std::string(buffer, r.ptr) : std::string("?");
}

/// True when v is 10^k for an integer k (to rounding).
inline bool is_power_of_ten(double v) {
  if (!(v > 0)) return false;
  const double k = std::round(std::log10(v));
  return std::abs(v / std::pow(10.0, k) - 1) < 1e-9;
}

/// An axis with its range and ticks resolved.
struct ResolvedAxis {
  AxisScale scale = AxisScale::linear;
  double min = 0, max = 1;
  std::vector<double> ticks;
  bool powers = false;  // labels as 10^k

  /// Position of `v` in [0, 1] along the axis, clamped; non-positive values on a log axis at 0.
  double fraction(double v) const {
    if (scale == AxisScale::log) {
      if (!(v > 0)) return 0.0;
      return std::clamp((std::log10(v) - std::log10(min)) / (std::log10(max) - std::log10(min)), 0.0, 1.0);
    }
    return std::clamp((v - min) / (max - min), 0.0, 1.0);
  }
};

/// A step of 1, 2 or 5 times a power of ten that cuts `span` into about five intervals.
inline double nice_step(double span) {
  const double raw = span / 5, power = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / power;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * power;
}

/// Resolves `axis` (named `argument`) over the values `data` (already checked finite): range, then ticks.
inline ResolvedAxis resolve_axis(const char* function, const std::string& argument, const ChartAxis& axis,
                                 const std::vector<double>& data) {
  ResolvedAxis r;
  r.scale = axis.scale;
  const bool log = axis.scale == AxisScale::log;
  const auto check_end = [&](const char* end, double v) {
    if (std::isinf(v) || (log && !std::isnan(v) && !(v > 0)))
      throw_invalid(function, argument + "." + end,
                    std::string("expected NaN (from the data) or a finite value") + (log ? " > 0 (log axis)" : "") +
                        ", got " + general_string(v));
  };
  check_end("min", axis.min);
  check_end("max", axis.max);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : data)
    if (!log || v > 0) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!(lo <= hi) && (std::isnan(axis.min) || std::isnan(axis.max)))
    throw_invalid(function, argument,
                  "a log axis needs a value > 0 to choose its range from; set " + argument + ".min and .max");
  if (log) {
    // From the data: out to the enclosing powers of ten (one decade each way if all values are equal).
    double a = std::isnan(axis.min) ? std::pow(10.0, std::floor(std::log10(lo) + 1e-9)) : axis.min;
    double b = std::isnan(axis.max) ? std::pow(10.0, std::ceil(std::log10(hi) - 1e-9)) : axis.max;
    if (std::isnan(axis.min) && std::isnan(axis.max) && a == b) {
      a /= 10;
      b *= 10;
    }
    r.min = a;
    r.max = b;
  } else {
    double a = std::isnan(axis.min) ? lo : axis.min, b = std::isnan(axis.max) ? hi : axis.max;
    if (std::isnan(axis.min) && std::isnan(axis.max) && a == b) {  // one value: a unit (or 10 %) around it
      const double half = a == 0 ? 1 : std::abs(a) / 10;
      a -= half;
      b += half;
    }
    if (a < b) {  // from the data: out to the next multiples of the tick step
      const double step = nice_step(b - a);
      if (std::isnan(axis.min)) a = std::floor(a / step + 1e-9) * step;
      if (std::isnan(axis.max)) b = std::ceil(b / step - 1e-9) * step;
    }
    r.min = a;
    r.max = b;
  }
  if (!(r.min < r.max))
    throw_invalid(function, argument + ".min",
                  "expected min < max, got [" + general_string(r.min) + ", " + general_string(r.max) + "]");
  // Ticks: the given ones inside the range, or chosen.
  const double slack = 1e-9 * (log ? 1.0 : r.max - r.min);
  const auto inside = [&](double v) {
    return log ? (v >= r.min * (1 - 1e-9) && v <= r.max * (1 + 1e-9)) : (v >= r.min - slack && v <= r.max + slack);
  };
  if (!axis.ticks.empty()) {
    for (double v : axis.ticks)
      if (std::isfinite(v) && inside(v)) r.ticks.push_back(v);
  } else if (log) {
    const int first = static_cast<int>(std::ceil(std::log10(r.min) - 1e-9));
    const int last = static_cast<int>(std::floor(std::log10(r.max) + 1e-9));
    const int every = std::max(1, (last - first + 7) / 8);  // at most about eight labelled decades
    for (int k = first; k <= last; k += every) r.ticks.push_back(std::pow(10.0, k));
    if (r.ticks.size() < 2) {  // less than a decade: powers of two
      r.ticks.clear();
      for (int k = static_cast<int>(std::ceil(std::log2(r.min) - 1e-9));
           k <= static_cast<int>(std::floor(std::log2(r.max) + 1e-9)); ++k)
        r.ticks.push_back(std::ldexp(1.0, k));
    }
  } else {
    const double step = nice_step(r.max - r.min);
    for (double k = std::ceil(r.min / step - 1e-9); k * step <= r.max + slack; k += 1)
      r.ticks.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
  }
  r.powers = log && !r.ticks.empty() && std::all_of(r.ticks.begin(), r.ticks.end(), is_power_of_ten);
  return r;
}

/// A tick label as SVG text content: 10^k with a raised exponent (`powers`), else the number, "-" as U+2212.
inline std::string tick_label(double v, bool powers) {
  const auto minus = [](std::string s) { return s[0] == '-' ? "\u2212" + s.substr(1) : s; };
  if (!powers) return xml_escape(minus(general_string(v)));
  const long k = std::lround(std::log10(v));
  if (k == 0) return "1";
  return "10<tspan dy=\"-6\" font-size=\"9\">" + minus(std::to_string(k)) + "</tspan>";
}

/// Width in px of a tick label at 11 px (an exponent at 9 px).
inline double tick_label_width(double v, bool powers) {
  if (!powers) return text_width(general_string(v), 11);
  const long k = std::lround(std::log10(v));
  return k == 0 ? text_width("1", 11) : text_width("10", 11) + text_width(std::to_string(k), 9);
}

/// Appends `<text>` whose content is already SVG markup (tick labels with a <tspan>).
inline void svg_markup_text(std::string& out, double x, double y, double size, const std::string& attributes,
                            const std::string& markup) {
  out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) + "\" " + attributes + ">" +
         markup + "</text>\n";
}

/// A straight line from (x1, y1) to (x2, y2) with extra `attributes`.
inline void svg_line(std::string& out, double x1, double y1, double x2, double y2, const std::string& attributes) {
  out += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) + "\" " +
         attributes + "/>\n";
}

/// A chart with its axes resolved and its series' colours chosen.
struct ResolvedChart {
  ResolvedAxis x, y;
  std::vector<std::string> colours;  // one per series
  double left = chart_left;          // room left of the plotting area: at least the widest y tick label
};

/// Checks `charts` and `o`, resolves every axis, gives colourless series the palette's colours in order.
inline std::vector<ResolvedChart> resolve_charts(const char* function, const std::vector<LineChart>& charts,
                                                 const LineChartOptions& o) {
  if (charts.empty()) throw_invalid(function, "charts", "expected at least one chart, got none");
  if (!(o.plot_width >= 80 && o.plot_width <= 2000))
    throw_invalid(function, "options.plot_width",
                  "expected a width in px in [80, 2000], got " + general_string(o.plot_width));
  if (!(o.plot_height >= 60 && o.plot_height <= 2000))
    throw_invalid(function, "options.plot_height",
                  "expected a height in px in [60, 2000], got " + general_string(o.plot_height));
  if (o.charts_per_row < 0)
    throw_invalid(function, "options.charts_per_row",
                  "expected 0 (one row) or a positive count, got " + std::to_string(o.charts_per_row));
  std::vector<ResolvedChart> resolved;
  std::size_t next_colour = 0;
  for (std::size_t c = 0; c < charts.size(); ++c) {
    const std::string name = "charts[" + std::to_string(c) + "]";
    const LineChart& chart = charts[c];
    if (chart.series.empty()) throw_invalid(function, name + ".series", "expected at least one series, got none");
    std::vector<double> xs, ys;
    ResolvedChart r;
    for (std::size_t s = 0; s < chart.series.size(); ++s) {
      const LineSeries& series = chart.series[s];
      const std::string sname = name + ".series[" + std::to_string(s) + "]";
      if (series.x.empty()) throw_invalid(function, sname + ".x", "expected at least one point, got none");
      if (series.y.size() != series.x.size())
        throw_invalid(function, sname + ".y",
                      "expected " + std::to_string(series.x.size()) + " values (as many as x), got " +
                          std::to_string(series.y.size()));
      for (const auto& [axis, values] : {std::pair<const char*, const std::vector<double>*>{".x", &series.x},
                                         std::pair<const char*, const std::vector<double>*>{".y", &series.y}})
        for (std::size_t i = 0; i < values->size(); ++i)
          if (!std::isfinite((*values)[i]))
            throw_invalid(function, sname + axis,
                          "expected finite values, got " + general_string((*values)[i]) + " at index " +
                              std::to_string(i));
      xs.insert(xs.end(), series.x.begin(), series.x.end());
      ys.insert(ys.end(), series.y.begin(), series.y.end());
      r.colours.push_back(series.colour.empty() ? line_chart_palette()[next_colour++ % line_chart_palette().size()]
                                                : series.colour);
    }
    r.x = resolve_axis(function, name + ".x", chart.x, xs);
    r.y = resolve_axis(function, name + ".y", chart.y, ys);
    for (double v : r.y.ticks) r.left = std::max(r.left, 30 + tick_label_width(v, r.y.powers));
    resolved.push_back(std::move(r));
  }
  return resolved;
}

/// Draws chart `c` (resolved as `r`) with the top-left corner of its cell at (left, top); its plotting area
/// starts r.left to the right and chart_top below.
inline void draw_line_chart(std::string& out, const LineChart& c, const ResolvedChart& r, double left, double top,
                            double width, double height) {
  const double x0 = left + r.left, y0 = top + chart_top;
  const auto px_x = [&](double v) { return x0 + width * r.x.fraction(v); };
  const auto px_y = [&](double v) { return y0 + height * (1 - r.y.fraction(v)); };
  if (!c.title.empty()) svg_text(out, x0, top + 18, 13, "font-weight=\"bold\"", c.title);
  for (double v : r.y.ticks) {  // grid lines and labels
    svg_line(out, x0, px_y(v), x0 + width, px_y(v), "stroke=\"#e5e5e5\"");
    svg_markup_text(out, x0 - 6, px_y(v) + 4, 11, "class=\"tick y\" text-anchor=\"end\"", tick_label(v, r.y.powers));
  }
  for (double v : r.x.ticks) {  // tick marks and labels
    svg_line(out, px_x(v), y0 + height, px_x(v), y0 + height + 4, "stroke=\"#555555\"");
    svg_markup_text(out, px_x(v), y0 + height + 17, 11, "class=\"tick x\" text-anchor=\"middle\"",
                    tick_label(v, r.x.powers));
  }
  out += "<rect class=\"plot\" x=\"" + px(x0) + "\" y=\"" + px(y0) + "\" width=\"" + px(width) + "\" height=\"" +
         px(height) + "\" fill=\"none\" stroke=\"#555555\"/>\n";
  if (!c.x.label.empty())
    svg_text(out, x0 + width / 2, y0 + height + 38, 12, "text-anchor=\"middle\" fill=\"#333333\"", c.x.label);
  if (!c.y.label.empty()) {
    const double ly = y0 + height / 2, lx = x0 - r.left + 16;
    svg_text(out, lx, ly, 12,
             "text-anchor=\"middle\" fill=\"#333333\" transform=\"rotate(-90 " + px(lx) + " " + px(ly) + ")\"",
             c.y.label);
  }
  for (const ReferenceLine& ref : c.references) {
    if (!(ref.y >= r.y.min && ref.y <= r.y.max)) continue;  // outside the range (or NaN): not drawn
    svg_line(out, x0, px_y(ref.y), x0 + width, px_y(ref.y),
             "class=\"reference\" stroke=\"#777777\" stroke-dasharray=\"2 3\"");
    if (!ref.label.empty())
      svg_text(out, x0 + width - 4, px_y(ref.y) - 5, 10, "text-anchor=\"end\" fill=\"#555555\"", ref.label);
  }
  for (std::size_t s = 0; s < c.series.size(); ++s) {
    const LineSeries& series = c.series[s];
    const std::string colour = xml_escape(r.colours[s]);
    std::string points;
    for (std::size_t i = 0; i < series.x.size(); ++i)
      points += (i ? " " : "") + px(px_x(series.x[i])) + "," + px(px_y(series.y[i]));
    out += "<polyline class=\"series\" points=\"" + points + "\" fill=\"none\" stroke=\"" + colour +
           "\" stroke-width=\"2\" stroke-linejoin=\"round\"" + (series.dashed ? " stroke-dasharray=\"6 4\"" : "") +
           "/>\n";
    if (series.markers)
      for (std::size_t i = 0; i < series.x.size(); ++i)
        out += "<circle class=\"marker\" cx=\"" + px(px_x(series.x[i])) + "\" cy=\"" + px(px_y(series.y[i])) +
               "\" r=\"3.5\" fill=\"" + colour + "\"/>\n";
  }
}

/// The whole picture: title, charts in rows of o.charts_per_row, the legend below.
inline std::string render_line_charts_svg(const char* function, const std::vector<LineChart>& charts,
                                          const LineChartOptions& o) {
  // 1. Validate and resolve axes and colours.
  const std::vector<ResolvedChart> resolved = resolve_charts(function, charts, o);

  // 2. Layout: every cell of the grid as wide as the widest chart (the plotting areas line up).
  const std::size_t count = charts.size();
  const std::size_t per_row =
      o.charts_per_row == 0 ? count : std::min(count, static_cast<std::size_t>(o.charts_per_row));
  const std::size_t rows = (count + per_row - 1) / per_row;
  double left = chart_left;
  for (const ResolvedChart& r : resolved) left = std::max(left, r.left);
  const double cell_w = left + o.plot_width + chart_gap, cell_h = chart_top + o.plot_height + chart_bottom;
  const double title_h = o.title.empty() ? 0.0 : chart_title_height;
  const double body_w = cell_w * static_cast<double>(per_row) - chart_gap;
  const double width = std::ceil(std::max(2 * chart_margin + body_w, 2 * chart_margin + text_width(o.title, 16, true)));
  const double legend_top = chart_margin + title_h + cell_h * static_cast<double>(rows);

  // 3. Legend: each label once (its first series' colour and style), flowing left to right.
  std::string legend;
  double lx = chart_margin + left, row = 0;
  bool any = false;
  std::vector<std::string> listed;
  for (std::size_t c = 0; c < count && o.legend; ++c)
    for (std::size_t s = 0; s < charts[c].series.size(); ++s) {
      const LineSeries& series = charts[c].series[s];
      if (series.label.empty() || std::find(listed.begin(), listed.end(), series.label) != listed.end()) continue;
      listed.push_back(series.label);
      const double w = 34 + text_width(series.label, 12) + 24;
      if (any && lx + w > width - chart_margin) {
        lx = chart_margin + left;
        row += 1;
      }
      any = true;
      const double y = legend_top + row * chart_legend_row + 10;
      svg_line(legend, lx, y - 4, lx + 26, y - 4,
               "stroke=\"" + xml_escape(resolved[c].colours[s]) + "\" stroke-width=\"3\"" +
                   (series.dashed ? " stroke-dasharray=\"6 4\"" : ""));
      svg_text(legend, lx + 32, y, 12, "class=\"legend\"", series.label);
      lx += w;
    }
  const double height = std::ceil(legend_top + (any ? (row + 1) * chart_legend_row : 0.0) + chart_margin);

  // 4. The document.
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"DejaVu Sans, Verdana, Helvetica, Arial, sans-serif\">\n";
  if (!o.title.empty()) out += "<title>" + xml_escape(o.title) + "</title>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  if (!o.title.empty()) svg_text(out, chart_margin, chart_margin + 17, 16, "font-weight=\"bold\"", o.title);
  for (std::size_t n = 0; n < count; ++n) {
    const double x = chart_margin + cell_w * static_cast<double>(n % per_row) + (left - resolved[n].left);
    const double y = chart_margin + title_h + cell_h * static_cast<double>(n / per_row);
    draw_line_chart(out, charts[n], resolved[n], x, y, o.plot_width, o.plot_height);
  }
  out += legend + "</svg>\n";
  return out;
}

}  // namespace detail

/// \brief Line charts side by side (o.charts_per_row to a row) under one title, with one legend below them.
///
/// Each chart has its own axes; series without a colour take line_chart_palette()'s colours in order across
/// all charts, so give colours when one quantity appears in several charts. The legend lists each label once.
/// Throws std::invalid_argument naming the argument (`charts`, `charts[i].series[j].y`, `charts[i].x.min`,
/// `options.plot_width`, ...) on bad input.
/// \code
/// LineChart c;
/// c.x.label = "depth";
/// c.y = {"spread", AxisScale::log, 1e-18, 1.0, {1e-16, 1e-12, 1e-8, 1e-4, 1}};
/// c.series.push_back({"attention only", "#d62728", depths, spread});
/// LineChartOptions opts;
/// opts.title = "Token spread vs depth";
/// std::string svg = line_charts_svg({c}, opts);
/// \endcode
inline std::string line_charts_svg(const std::vector<LineChart>& charts, const LineChartOptions& options = {}) {
  return detail::render_line_charts_svg("line_charts_svg", charts, options);
}

/// \brief line_charts_svg written to `path` (replaced); std::runtime_error naming the path if that fails.
inline void write_line_charts_svg(const std::string& path, const std::vector<LineChart>& charts,
                                  const LineChartOptions& options = {}) {
  detail::write_file_atomically("write_line_charts_svg", path,
                                detail::render_line_charts_svg("write_line_charts_svg", charts, options));
}

}  // namespace selfattn
