/// \file
/// Geometry of the pictures, in px: where the labels, titles and cells of one panel go (label space, rotated
/// column labels), how panels share a grid, and the margins and gaps around them.
#pragma once

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

/// Space around the whole picture, between panels (and between the panels and the legend), under its title.
inline constexpr double picture_margin = 14, panel_gap = 28, picture_title_height = 34;

/// True when `n` is in `list`.
inline bool contains(const std::vector<Index>& list, Index n) {
  return std::find(list.begin(), list.end(), n) != list.end();
}

/// Sizes of one panel, in px, relative to its top-left corner.
struct PanelLayout {
  double label_font = 12, value_font = 11;
  bool rotate = false;            // column labels at -45 degrees
  double grid_x = 0, grid_y = 0;  // top-left corner of the cells
  double width = 0, height = 0;
};

/// Where the parts of panel `p` go with cells of `cell` px (labels `rows`, `columns`): fonts from the cell size,
/// column labels rotated when two neighbours would collide, room for the widest row label, title and axis names.
inline PanelLayout layout_panel(const HeatmapPanel& p, const std::vector<std::string>& rows,
                                const std::vector<std::string>& columns, double cell) {
  PanelLayout l;
  l.label_font = std::clamp(cell * 0.3, 9.0, 13.0);
  l.value_font = std::clamp(cell * 0.27, 7.0, 11.0);
  const double sin45 = 0.7071067811865476;
  std::vector<double> widths;  // of the column labels, bold where asked
  for (std::size_t j = 0; j < columns.size(); ++j)
    widths.push_back(text_width(columns[j], l.label_font, contains(p.bold_column_labels, static_cast<Index>(j))));
  // Horizontal labels are centred on their columns: two neighbours collide when their half widths add up
  // to more than the distance between the centres (one cell, less a small gap).
  double widest_column = 0;
  for (std::size_t j = 0; j < widths.size(); ++j) {
    widest_column = std::max(widest_column, widths[j]);
    if (j > 0 && (widths[j - 1] + widths[j]) / 2 > cell - 3.0) l.rotate = true;
  }
  double top = p.title.empty() ? 0.0 : 22.0, right_overflow = 0;
  if (!p.column_axis.empty()) top += 16.0;
  const double n = static_cast<double>(columns.size());
  for (std::size_t j = 0; j < widths.size(); ++j) {
    const double centre = (static_cast<double>(j) + 0.5) * cell;
    // A label rotated about its start near the cell centre rises w sin45 and runs w cos45 to the right.
    const double right = l.rotate ? centre + widths[j] * sin45 + l.label_font * 0.5 : centre + widths[j] / 2;
    right_overflow = std::max(right_overflow, right - n * cell);
  }
  top += l.rotate ? widest_column * sin45 + l.label_font + 4.0 : l.label_font + 8.0;
  double widest_row = 0;
  for (const std::string& label : rows) widest_row = std::max(widest_row, text_width(label, l.label_font, true));
  l.grid_x = (p.row_axis.empty() ? 0.0 : 20.0) + widest_row + 8.0;
  if (!l.rotate && !widths.empty()) l.grid_x = std::max(l.grid_x, widths[0] / 2 - cell / 2);  // the first label
  l.grid_y = top;
  const double grid_w = static_cast<double>(p.columns) * cell, grid_h = static_cast<double>(p.rows) * cell;
  const double axis_w = text_width(p.column_axis, 11.0);
  l.width = std::max({l.grid_x + grid_w + std::max(right_overflow, 0.0), text_width(p.title, 13.0, true),
                      l.grid_x + grid_w / 2 + axis_w / 2});
  l.height = std::max(l.grid_y + grid_h, p.row_axis.empty() ? 0.0 : l.grid_y + text_width(p.row_axis, 11.0));
  return l;
}

/// Panels arranged row by row, `per_row` to a grid row: panels of one grid column share the left edge of their
/// cells, panels of one grid row the top edge, and each grid column is as wide as its widest panel.
struct GridLayout {
  std::size_t per_row = 1;                                          // panels per grid row
  std::vector<std::vector<std::string>> row_labels, column_labels;  // of each panel: given, or numbered
  std::vector<PanelLayout> layouts;                                 // of each panel, aligned as above
  std::vector<double> column_w, row_h;                              // of each grid column, each grid row
  double width = 0, height = 0;                                     // of all the panels, gaps included
};

/// Lays out `panels` (validated) with `grid_columns` per row (0: ceil(sqrt(count))) and cells of `cell` px.
inline GridLayout layout_grid(const char* function, const std::vector<HeatmapPanel>& panels, Index grid_columns,
                              double cell) {
  GridLayout g;
  const std::size_t count = panels.size();
  std::size_t per_row = grid_columns > 0 ? static_cast<std::size_t>(grid_columns)
                                         : static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  per_row = std::max<std::size_t>(1, std::min(per_row, std::max<std::size_t>(count, 1)));
  g.per_row = per_row;
  g.row_labels.resize(count);
  g.column_labels.resize(count);
  g.layouts.resize(count);
  for (std::size_t n = 0; n < count; ++n) {
    g.row_labels[n] = resolve_labels(function, "row_labels", panels[n].row_labels, panels[n].rows, "rows");
    g.column_labels[n] =
        resolve_labels(function, "column_labels", panels[n].column_labels, panels[n].columns, "columns");
    g.layouts[n] = layout_panel(panels[n], g.row_labels[n], g.column_labels[n], cell);
  }
  std::vector<PanelLayout>& layouts = g.layouts;
  for (std::size_t n = 0; n < count; ++n)
    for (std::size_t m = 0; m < count; ++m) {
      if (m % per_row == n % per_row && layouts[m].grid_x > layouts[n].grid_x) {
        layouts[n].width += layouts[m].grid_x - layouts[n].grid_x;
        layouts[n].grid_x = layouts[m].grid_x;
      }
      if (m / per_row == n / per_row && layouts[m].grid_y > layouts[n].grid_y) {
        layouts[n].height += layouts[m].grid_y - layouts[n].grid_y;
        layouts[n].grid_y = layouts[m].grid_y;
      }
    }
  g.column_w.assign(per_row, 0.0);
  g.row_h.assign((count + per_row - 1) / per_row, 0.0);
  for (std::size_t n = 0; n < count; ++n) {
    g.column_w[n % per_row] = std::max(g.column_w[n % per_row], layouts[n].width);
    g.row_h[n / per_row] = std::max(g.row_h[n / per_row], layouts[n].height);
  }
  for (double w : g.column_w) g.width += w;
  for (double h : g.row_h) g.height += h;
  g.width += panel_gap * static_cast<double>(g.column_w.size() - 1);
  g.height += panel_gap * static_cast<double>(std::max<std::size_t>(g.row_h.size(), 1) - 1);
  return g;
}

}  // namespace detail
}  // namespace selfattn
