/// \file
/// The SVG document of a picture: validation, then each panel drawn cell by cell (labels, coloured cells,
/// values, outlines) in its place in the grid, the title, and the legend.
#pragma once

#include <selfattn/plot/colour_map.hpp>
#include <selfattn/plot/colour_scale.hpp>
#include <selfattn/plot/heatmap_options.hpp>
#include <selfattn/plot/layout.hpp>
#include <selfattn/plot/panel.hpp>
#include <selfattn/plot/text.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace selfattn {
namespace detail {

/// Draws panel `p` at (x0, y0) as laid out in `l`: title, axis names, labels, one <rect class="cell ..."> per
/// cell coloured by its position in `range`, values, outlines.
inline void draw_panel(std::string& out, const HeatmapPanel& p, const std::vector<std::string>& rows,
                       const std::vector<std::string>& columns, const PanelLayout& l, double x0, double y0,
                       const HeatmapOptions& o, const ColourRange& range) {
  const double cell = o.cell_size, gx = x0 + l.grid_x, gy = y0 + l.grid_y;
  const double grid_w = static_cast<double>(p.columns) * cell, grid_h = static_cast<double>(p.rows) * cell;
  const std::string bold = "font-weight=\"bold\"";
  if (!p.title.empty()) svg_text(out, x0, y0 + 14, 13, bold, p.title);
  if (!p.column_axis.empty())
    svg_text(out, gx + grid_w / 2, y0 + (p.title.empty() ? 0.0 : 22.0) + 12, 11,
             "text-anchor=\"middle\" fill=\"#555555\"", p.column_axis);
  if (!p.row_axis.empty()) {
    const double cy = gy + grid_h / 2;
    svg_text(out, x0 + 12, cy, 11,
             "text-anchor=\"middle\" fill=\"#555555\" transform=\"rotate(-90 " + px(x0 + 12) + " " + px(cy) + ")\"",
             p.row_axis);
  }
  for (Index j = 0; j < p.columns; ++j) {  // key labels above the columns
    const double cx = gx + (static_cast<double>(j) + 0.5) * cell;
    const std::string weight = contains(p.bold_column_labels, j) ? " " + bold : "";
    const std::string& label = columns[static_cast<std::size_t>(j)];
    if (l.rotate) {
      const double y = gy - 6;
      svg_text(out, cx - l.label_font * 0.25, y, l.label_font,
               "class=\"label column\" transform=\"rotate(-45 " + px(cx - l.label_font * 0.25) + " " + px(y) + ")\"" +
                   weight,
               label);
    } else {
      svg_text(out, cx, gy - 7, l.label_font, "class=\"label column\" text-anchor=\"middle\"" + weight, label);
    }
  }
  for (Index i = 0; i < p.rows; ++i) {  // query label left of each row, then the row's cells
    const double cy = gy + (static_cast<double>(i) + 0.5) * cell;
    svg_text(
        out, gx - 8, cy + l.label_font * 0.35, l.label_font,
        std::string("class=\"label row\" text-anchor=\"end\"") + (contains(p.bold_row_labels, i) ? " " + bold : ""),
        rows[static_cast<std::size_t>(i)]);
    for (Index j = 0; j < p.columns; ++j) {
      const std::size_t n = static_cast<std::size_t>(i * p.columns + j);
      const double value = p.values[n];
      const bool masked = !p.masked.empty() && p.masked[n];
      const bool nan = std::isnan(value);
      const Rgb colour = colour_at(o.colour_map, range.position(value));  // clamped by colour_at
      const std::string kind = masked ? "cell masked" : nan ? "cell nan" : "cell";
      const std::string fill = masked ? masked_fill : nan ? nan_fill : hex_colour(colour);
      const double x = gx + static_cast<double>(j) * cell, y = gy + static_cast<double>(i) * cell;
      out += "<rect class=\"" + kind + "\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(cell) +
             "\" height=\"" + px(cell) + "\" fill=\"" + fill + "\" stroke=\"#e0e0e0\" stroke-width=\"0.5\"/>\n";
      // A masked cell holding its expected exact 0 says nothing more; anything else is worth printing.
      const bool print = (o.show_values && !(masked && value == 0.0)) || nan;
      const std::string text = fixed_string(value, o.decimals);
      if (!print || text_width(text, l.value_font) > cell - 4) continue;
      const std::string ink = nan ? nan_text : (masked || is_light(colour)) ? "#222222" : "#ffffff";
      svg_text(out, x + cell / 2, y + cell / 2 + l.value_font * 0.35, l.value_font,
               "class=\"value\" text-anchor=\"middle\" fill=\"" + std::string(ink) + "\"", text);
    }
  }
  for (Index i : p.outlined_rows)
    out += "<rect class=\"outline\" x=\"" + px(gx) + "\" y=\"" + px(gy + static_cast<double>(i) * cell) +
           "\" width=\"" + px(grid_w) + "\" height=\"" + px(cell) + "\" fill=\"none\" stroke=\"" + outline_colour +
           "\" stroke-width=\"2\"/>\n";
  for (Index j : p.outlined_columns)
    out += "<rect class=\"outline\" x=\"" + px(gx + static_cast<double>(j) * cell) + "\" y=\"" + px(gy) +
           "\" width=\"" + px(cell) + "\" height=\"" + px(grid_h) + "\" fill=\"none\" stroke=\"" + outline_colour +
           "\" stroke-width=\"2\"/>\n";
}

/// The whole picture: title, panels in a grid, and one colour scale (with masked / NaN swatches when used).
inline std::string render_heatmap_svg(const char* function, const std::vector<HeatmapPanel>& panels,
                                      const HeatmapOptions& o) {
  validate_heatmap_options(function, o);
  for (std::size_t n = 0; n < panels.size(); ++n) validate_panel(function, panels[n], n);

  // 1. Colour range: fixed, or the finite unmasked extremes.
  const ColourRange range = colour_range(panels, o);

  // 2. Layout: panels row by row (grid_columns per row), the legend right of them.
  const GridLayout grid = layout_grid(function, panels, o.grid_columns, o.cell_size);
  const Legend legend = layout_legend(range, o.legend_label, grid.height);
  const double title_h = o.title.empty() ? 0.0 : picture_title_height;
  const double body_y = picture_margin + title_h, legend_x = picture_margin + grid.width + panel_gap;
  const double width = std::ceil(
      std::max(legend_x + legend.width + picture_margin, 2 * picture_margin + text_width(o.title, 16.0, true)));
  const double height = std::ceil(body_y + std::max(grid.height, legend.height) + picture_margin);

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"DejaVu Sans, Verdana, Helvetica, Arial, sans-serif\">\n";
  if (!o.title.empty()) out += "<title>" + xml_escape(o.title) + "</title>\n";
  out += std::string("<defs>\n") + masked_pattern + scale_gradient(o.colour_map) + "</defs>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  if (!o.title.empty()) svg_text(out, picture_margin, picture_margin + 17, 16, "font-weight=\"bold\"", o.title);

  // 3. Panels.
  double y = body_y;
  for (std::size_t r = 0; r < grid.row_h.size(); ++r) {
    double x = picture_margin;
    for (std::size_t c = 0; c < grid.per_row && r * grid.per_row + c < panels.size(); ++c) {
      const std::size_t n = r * grid.per_row + c;
      draw_panel(out, panels[n], grid.row_labels[n], grid.column_labels[n], grid.layouts[n], x, y, o, range);
      x += grid.column_w[c] + panel_gap;
    }
    y += grid.row_h[r] + panel_gap;
  }

  // 4. Legend: the colour scale from lo (bottom) to hi (top), tick values, swatches.
  draw_legend(out, legend, range, o.legend_label, legend_x, body_y);
  out += "</svg>\n";
  return out;
}

}  // namespace detail
}  // namespace selfattn
