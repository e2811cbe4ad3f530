/// \file
/// Pictures of attention: attention weights as an SVG heatmap (one head, a grid of heads, or panels of any
/// matrices) and as CSV.
///
/// Every SVG is self-contained (no scripts, no external fonts or files): token labels on both axes (query
/// labels left of the rows, key labels above the columns, rotated by 45 degrees when they are wider than a
/// cell), a title, a colour scale with tick values, optionally the number in each cell. Masked cells are
/// hatched grey and NaN cells pale red with "NaN", each with its swatch in the legend. All text is
/// XML-escaped, so labels such as "<eos>" or "a&b" give valid XML. Functions return the text as a
/// `std::string`; the `write_*` twins write it to a file and throw `std::runtime_error` when they cannot.
/// Numbers are formatted with `std::to_chars`, so the output does not depend on the C locale.
/// Guide with pictures: docs/pictures.md.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace selfattn {

/// \brief Sequential colour maps of the heatmaps: the low end of the range first.
enum class ColourMap {
  blues,   ///< near white to dark blue (ColorBrewer "Blues"): zero weight reads as empty paper; the default
  viridis  ///< dark purple to yellow (matplotlib's viridis): perceptually uniform, readable in greyscale
};

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

/// \brief One matrix of a multi-panel picture (heatmap_panels_svg): values, labels and emphasis.
///
/// Shapes: `values` holds rows * columns entries, row-major; `masked` is empty or of the same size.
/// Most callers make one with make_heatmap_panel and then set the emphasis fields.
/// \code
/// HeatmapPanel p = make_heatmap_panel(weights[0][2], words, words, "head 2");
/// p.bold_row_labels = {10};     // the query "it"
/// p.outlined_rows = {10};
/// \endcode
struct HeatmapPanel {
  std::string title;                       ///< drawn above the panel; empty: none
  Index rows = 0;                          ///< number of rows (queries, or whatever the rows are)
  Index columns = 0;                       ///< number of columns (keys)
  std::vector<double> values;              ///< rows * columns values, row-major
  std::vector<bool> masked;                ///< empty, or rows * columns flags: true = draw the cell as masked
  std::vector<std::string> row_labels;     ///< rows labels, or empty: numbered 0, 1, ...
  std::vector<std::string> column_labels;  ///< columns labels, or empty: numbered 0, 1, ...
  std::string row_axis = "query";          ///< name of the row axis, written vertically at the left; empty: none
  std::string column_axis = "key";         ///< name of the column axis, written above the column labels; empty: none
  std::vector<Index> bold_row_labels;      ///< rows whose label is bold
  std::vector<Index> bold_column_labels;   ///< columns whose label is bold
  std::vector<Index> outlined_rows;        ///< rows framed in red
  std::vector<Index> outlined_columns;     ///< columns framed in red
};

namespace detail {

// ---- Text: XML escaping, UTF-8 cleaning, width estimates, locale-free numbers ---------------------------

/// Decodes one UTF-8 code point at text[at]; returns its length in bytes, or 0 if the bytes there are not
/// a well-formed UTF-8 encoding of a character XML 1.0 accepts (overlong forms, surrogates, U+FFFE/FFFF,
/// controls other than tab, line feed and carriage return are all refused).
inline std::size_t utf8_char_length(const std::string& text, std::size_t at) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[at + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return (lead >= 0x20 || lead == '\t' || lead == '\n' || lead == '\r') ? 1 : 0;
  // The lead byte gives the length; `least` is the smallest code point that needs it (so no overlong forms).
  std::size_t length = 4;
  char32_t code = lead & 0x07, least = 0x10000;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1F;
    least = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0F;
    least = 0x800;
  } else if ((lead & 0xF8) != 0xF0) {
    return 0;  // a continuation byte, or 0xF8..0xFF: never a lead byte
  }
  if (at + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(k) & 0x3F);
  }
  const bool valid =
      code >= least && code <= 0x10FFFF && !(code >= 0xD800 && code <= 0xDFFF) && code != 0xFFFE && code != 0xFFFF;
  return valid ? length : 0;
}

/// Text for XML content or a quoted attribute: the five special characters as entities, and every byte
/// sequence XML cannot hold (invalid UTF-8, control characters) as U+FFFD, so any label gives valid XML.
inline std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t length = utf8_char_length(text, at);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++at;
      continue;
    }
    switch (text[at]) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out.append(text, at, length);
    }
    at += length;
  }
  return out;
}

/// Estimated width in px of `text` at `font_size` px: DejaVu Sans's advance widths (the sans-serif of
/// Debian's rasterisers, wider than Helvetica or Arial) for ASCII, 1 em for anything else (accents, CJK),
/// plus 4% (bold: 14%). Generous on purpose: layouts leave room rather than clip.
inline double text_width(const std::string& text, double font_size, bool bold = false) {
  // Advance widths in 1/1000 em of the printable ASCII characters ' ' (32) to '~' (126).
  static constexpr unsigned short advance[95] = {
      318,  401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337,  // space to /
      636,  636, 636, 636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531,  // 0 to ?
      1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656, 557, 863, 748, 787,  // @ to O
      603,  787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500,  // P to _
      500,  613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612,  // ` to o
      635,  635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838};      // p to ~
  double em = 0;
  for (std::size_t at = 0; at < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[at]);
    em += c >= 32 && c <= 126 ? advance[c - 32] / 1000.0 : 1.0;
    at += std::max<std::size_t>(utf8_char_length(text, at), 1);
  }
  return em * font_size * (bold ? 1.14 : 1.04);
}

/// `value` with `decimals` digits after the point (std::to_chars: no locale); "NaN", "inf", "-inf" as such.
inline std::string fixed_string(double value, int decimals) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[512];  // a fixed-format double needs at most 309 digits before the point
  const std::to_chars_result r =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed, decimals);
  return r.ec == std::errc() ? std::string(buffer, r.ptr) : std::string("?");
}

/// A coordinate or length for an SVG attribute: at most two decimals, trailing zeros dropped.
inline std::string px(double value) {
  std::string text = fixed_string(std::round(value * 100.0) / 100.0, 2);
  if (text.find('.') != std::string::npos) {
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
  }
  return text == "-0" ? "0" : text;
}

/// Shortest text that reads back as exactly `value` (std::to_chars); "nan", "inf", "-inf" for non-finite.
template <typename T>
std::string round_trip_string(T value) {
  char buffer[64];
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, r.ptr);
}

/// One CSV field per RFC 4180: quoted when it holds a comma, a double quote, CR or LF; quotes doubled.
inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// ---- Colours --------------------------------------------------------------------------------------------

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

inline std::string hex_colour(const Rgb& c) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", static_cast<int>(std::lround(c.r)),
                static_cast<int>(std::lround(c.g)), static_cast<int>(std::lround(c.b)));
  return text;
}

/// True when dark text is the readable one on `c` (perceived lightness, Rec. 709 weights, above ~0.55).
inline bool is_light(const Rgb& c) { return (0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b) / 255.0 > 0.55; }

inline constexpr const char* masked_fill = "url(#selfattn-masked)";  // hatched light grey: a pattern in <defs>
inline constexpr const char* nan_fill = "#fcd5d5";                   // pale red: no colour map starts or ends there
inline constexpr const char* nan_text = "#b2182b";
inline constexpr const char* outline_colour = "#d62728";

// ---- Validation -----------------------------------------------------------------------------------------

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

/// `labels`, or "0", "1", ... when empty; ShapeError naming `argument` when the count is wrong.
inline std::vector<std::string> resolve_labels(const char* function, const std::string& argument,
                                               const std::vector<std::string>& labels, Index count,
                                               const std::string& extent) {
  if (labels.empty()) {
    std::vector<std::string> numbered;
    for (Index n = 0; n < count; ++n) numbered.push_back(std::to_string(n));
    return numbered;
  }
  if (static_cast<Index>(labels.size()) != count)
    throw_shape_error(function, argument,
                      "expected " + std::to_string(count) + " labels (" + extent + " = " + std::to_string(count) +
                          ") or none, got " + std::to_string(labels.size()));
  return labels;
}

inline void check_indices(const char* function, const std::string& argument, const std::vector<Index>& indices,
                          Index extent) {
  for (Index n : indices)
    if (n < 0 || n >= extent)
      throw_invalid(function, argument,
                    "index " + std::to_string(n) + " out of range [0, " + std::to_string(extent) + ")");
}

inline void validate_panel(const char* function, const HeatmapPanel& p, std::size_t index) {
  const std::string name = "panels[" + std::to_string(index) + "].";
  if (p.rows < 0 || p.columns < 0)
    throw_shape_error(function, name + "rows",
                      "expected non-negative rows and columns, got (" + std::to_string(p.rows) + ", " +
                          std::to_string(p.columns) + ")");
  const std::size_t cells = static_cast<std::size_t>(p.rows) * static_cast<std::size_t>(p.columns);
  const std::string grid = " (rows " + std::to_string(p.rows) + " x columns " + std::to_string(p.columns) + ")";
  if (p.values.size() != cells)
    throw_shape_error(
        function, name + "values",
        "expected " + std::to_string(cells) + " values" + grid + ", got " + std::to_string(p.values.size()));
  if (!p.masked.empty() && p.masked.size() != cells)
    throw_shape_error(
        function, name + "masked",
        "expected none or " + std::to_string(cells) + " flags" + grid + ", got " + std::to_string(p.masked.size()));
  resolve_labels(function, name + "row_labels", p.row_labels, p.rows, "rows");
  resolve_labels(function, name + "column_labels", p.column_labels, p.columns, "columns");
  check_indices(function, name + "bold_row_labels", p.bold_row_labels, p.rows);
  check_indices(function, name + "bold_column_labels", p.bold_column_labels, p.columns);
  check_indices(function, name + "outlined_rows", p.outlined_rows, p.rows);
  check_indices(function, name + "outlined_columns", p.outlined_columns, p.columns);
}

/// allowed(b, h, i, j) with NumPy broadcasting (an extent of 1 repeats); true when there is no mask.
inline bool allowed_at(const TensorView<const bool, 4>& allowed, Index b, Index h, Index i, Index j) {
  if (!allowed.data()) return true;
  const auto at = [&](int d, Index n) { return allowed.dim(d) == 1 ? Index{0} : n; };
  return allowed(at(0, b), at(1, h), at(2, i), at(3, j));
}

/// Panel of head (b, h) of a (B, H, Lq, Lk) tensor, masked cells from `options`.
template <typename T>
HeatmapPanel head_panel(const TensorView<const T, 4>& w, Index b, Index h, std::vector<std::string> query_labels,
                        std::vector<std::string> key_labels, const HeatmapOptions& options) {
  HeatmapPanel p;
  p.rows = w.dim(2);
  p.columns = w.dim(3);
  p.row_labels = std::move(query_labels);
  p.column_labels = std::move(key_labels);
  p.values.reserve(static_cast<std::size_t>(p.rows * p.columns));
  p.masked.reserve(static_cast<std::size_t>(p.rows * p.columns));
  for (Index i = 0; i < p.rows; ++i)
    for (Index j = 0; j < p.columns; ++j) {
      const double value = static_cast<double>(w(b, h, i, j));
      p.values.push_back(value);
      p.masked.push_back(!allowed_at(options.allowed, b, h, i, j) || (options.zero_is_masked && value == 0.0));
    }
  return p;
}

// ---- Layout and drawing ---------------------------------------------------------------------------------

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

inline void svg_text(std::string& out, double x, double y, double size, const std::string& attributes,
                     const std::string& text) {
  out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) + "\"" +
         (attributes.empty() ? "" : " " + attributes) + ">" + xml_escape(text) + "</text>\n";
}

/// Draws panel `p` at (x0, y0): title, axis names, labels, one <rect class="cell ..."> per cell, values.
inline void draw_panel(std::string& out, const HeatmapPanel& p, const std::vector<std::string>& rows,
                       const std::vector<std::string>& columns, const PanelLayout& l, double x0, double y0,
                       const HeatmapOptions& o, double lo, double hi) {
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
      // t = (value - lo) / (hi - lo): the position of the value in the colour range, clamped by colour_at.
      const Rgb colour = colour_at(o.colour_map, (value - lo) / (hi - lo));
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

  // 1. Colour range: fixed, or the finite unmasked extremes (a constant matrix gets a unit-wide range).
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

  // 2. Layout: panels row by row (grid_columns per row), each column as wide as its widest panel.
  const std::size_t count = panels.size();
  std::size_t per_row = o.grid_columns > 0 ? static_cast<std::size_t>(o.grid_columns)
                                           : static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  per_row = std::max<std::size_t>(1, std::min(per_row, std::max<std::size_t>(count, 1)));
  std::vector<std::vector<std::string>> row_labels(count), column_labels(count);
  std::vector<PanelLayout> layouts(count);
  for (std::size_t n = 0; n < count; ++n) {
    row_labels[n] = resolve_labels(function, "row_labels", panels[n].row_labels, panels[n].rows, "rows");
    column_labels[n] = resolve_labels(function, "column_labels", panels[n].column_labels, panels[n].columns, "columns");
    layouts[n] = layout_panel(panels[n], row_labels[n], column_labels[n], o.cell_size);
  }
  // Panels of one grid column share the left edge of their cells, panels of one grid row the top edge.
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
  const double margin = 14, gap = 28, title_h = o.title.empty() ? 0.0 : 34.0;
  std::vector<double> column_w(per_row, 0.0), row_h((count + per_row - 1) / per_row, 0.0);
  for (std::size_t n = 0; n < count; ++n) {
    column_w[n % per_row] = std::max(column_w[n % per_row], layouts[n].width);
    row_h[n / per_row] = std::max(row_h[n / per_row], layouts[n].height);
  }
  double panels_w = 0, panels_h = 0;
  for (double w : column_w) panels_w += w;
  for (double h : row_h) panels_h += h;
  panels_w += gap * static_cast<double>(column_w.size() - 1);
  panels_h += gap * static_cast<double>(std::max<std::size_t>(row_h.size(), 1) - 1);

  // The legend: label, a vertical bar (maximum at the top) with five ticks, then the swatches.
  const double bar_w = 16, bar_h = std::clamp(panels_h * 0.6, 120.0, 240.0), tick_font = 11;
  std::vector<std::string> ticks;
  for (int k = 0; k <= 4; ++k) {
    const double value = lo + (hi - lo) * k / 4.0;
    const double shown = std::abs(value) < 1e-12 * (hi - lo) ? 0.0 : value;  // no "1.39e-17" for a zero tick
    char text[64];
    const std::to_chars_result r = std::to_chars(text, text + sizeof text, shown, std::chars_format::general, 3);
    ticks.emplace_back(text, r.ptr);
  }
  double legend_w = std::max(text_width(o.legend_label, 11.0), 24.0);
  for (const std::string& tick : ticks) legend_w = std::max(legend_w, bar_w + 10 + text_width(tick, tick_font));
  if (any_masked || any_nan) legend_w = std::max(legend_w, 14 + 6 + text_width("masked", tick_font));
  const double legend_h = 24 + bar_h + (any_masked ? 24.0 : 0.0) + (any_nan ? 24.0 : 0.0) + 8;

  const double body_y = margin + title_h, legend_x = margin + panels_w + gap;
  const double width = std::ceil(std::max(legend_x + legend_w + margin, 2 * margin + text_width(o.title, 16.0, true)));
  const double height = std::ceil(body_y + std::max(panels_h, legend_h) + margin);

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"DejaVu Sans, Verdana, Helvetica, Arial, sans-serif\">\n";
  if (!o.title.empty()) out += "<title>" + xml_escape(o.title) + "</title>\n";
  out +=
      "<defs>\n<pattern id=\"selfattn-masked\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f0f0f0\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bdbdbd\" stroke-width=\"2\"/></pattern>\n";
  out += "<linearGradient id=\"selfattn-scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int k = 0; k <= 8; ++k)
    out += "<stop offset=\"" + px(k / 8.0) + "\" stop-color=\"" + hex_colour(colour_at(o.colour_map, k / 8.0)) + "\"/>";
  out += "</linearGradient>\n</defs>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  if (!o.title.empty()) svg_text(out, margin, margin + 17, 16, "font-weight=\"bold\"", o.title);

  // 3. Panels.
  double y = body_y;
  for (std::size_t r = 0; r < row_h.size(); ++r) {
    double x = margin;
    for (std::size_t c = 0; c < per_row && r * per_row + c < count; ++c) {
      const std::size_t n = r * per_row + c;
      draw_panel(out, panels[n], row_labels[n], column_labels[n], layouts[n], x, y, o, lo, hi);
      x += column_w[c] + gap;
    }
    y += row_h[r] + gap;
  }

  // 4. Legend: the colour scale from lo (bottom) to hi (top), tick values, swatches.
  out += "<g class=\"legend\">\n";
  svg_text(out, legend_x, body_y + 11, 11, "fill=\"#333333\"", o.legend_label);
  const double bar_y = body_y + 24;
  out += "<rect class=\"scale\" x=\"" + px(legend_x) + "\" y=\"" + px(bar_y) + "\" width=\"" + px(bar_w) +
         "\" height=\"" + px(bar_h) + "\" fill=\"url(#selfattn-scale)\" stroke=\"#888888\" stroke-width=\"0.5\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double ty = bar_y + bar_h * (1.0 - k / 4.0);
    out += "<line x1=\"" + px(legend_x + bar_w) + "\" y1=\"" + px(ty) + "\" x2=\"" + px(legend_x + bar_w + 4) +
           "\" y2=\"" + px(ty) + "\" stroke=\"#888888\"/>\n";
    svg_text(out, legend_x + bar_w + 7, ty + tick_font * 0.35, tick_font, "class=\"tick\" fill=\"#333333\"",
             ticks[static_cast<std::size_t>(k)]);
  }
  double sy = bar_y + bar_h + 12;
  const auto swatch = [&](const std::string& fill, const std::string& label) {
    out += "<rect class=\"swatch\" x=\"" + px(legend_x) + "\" y=\"" + px(sy) + "\" width=\"14\" height=\"14\" fill=\"" +
           fill + "\" stroke=\"#888888\" stroke-width=\"0.5\"/>\n";
    svg_text(out, legend_x + 20, sy + 11, tick_font, "fill=\"#333333\"", label);
    sy += 24;
  };
  if (any_masked) swatch(masked_fill, "masked");
  if (any_nan) swatch(nan_fill, "NaN");
  out += "</g>\n</svg>\n";
  return out;
}

template <typename T>
std::string csv_of(const char* function, const TensorView<const T, 4>& w, Index b, Index h,
                   const std::vector<std::string>& query_labels, const std::vector<std::string>& key_labels) {
  const std::vector<std::string> rows = resolve_labels(function, "query_labels", query_labels, w.dim(2), "Lq");
  const std::vector<std::string> columns = resolve_labels(function, "key_labels", key_labels, w.dim(3), "Lk");
  std::string out;  // RFC 4180: CRLF line ends, an empty corner field, the key labels as the header
  for (const std::string& label : columns) out += "," + csv_field(label);
  out += "\r\n";
  for (Index i = 0; i < w.dim(2); ++i) {
    out += csv_field(rows[static_cast<std::size_t>(i)]);
    for (Index j = 0; j < w.dim(3); ++j) out += "," + round_trip_string(w(b, h, i, j));
    out += "\r\n";
  }
  return out;
}

inline void check_batch(const char* function, const std::array<Index, 4>& shape, Index batch) {
  if (batch < 0 || batch >= shape[0])
    throw_invalid(function, "batch",
                  "expected an index in [0, " + std::to_string(shape[0]) + ") (B), got " + std::to_string(batch));
}

inline void check_batch_head(const char* function, const std::array<Index, 4>& shape, Index batch, Index head) {
  check_batch(function, shape, batch);
  if (head < 0 || head >= shape[1])
    throw_invalid(function, "head",
                  "expected an index in [0, " + std::to_string(shape[1]) + ") (H), got " + std::to_string(head));
}

/// A (Lq, Lk) matrix as head (0, 0) of a (1, 1, Lq, Lk) view.
template <typename T>
TensorView<const T, 4> as_single_head(const TensorView<const T, 2>& m) {
  return TensorView<const T, 4>(m.data(), {1, 1, m.dim(0), m.dim(1)}, {0, 0, m.stride(0), 1});
}

/// Writes `text` to `path` (replacing the file); std::runtime_error naming the path if that fails.
inline void write_text_file(const char* function, const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  const auto fail = [&](const char* what) {
    const std::string reason = errno != 0 ? ": " + std::generic_category().message(errno) : std::string();
    throw std::runtime_error(std::string("[") + function + "] path: cannot " + what + " '" + path + "'" + reason);
  };
  if (!file) fail("open for writing");
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  if (!file) fail("write");
}

template <typename W>
constexpr bool is_weights_matrix = is_tensor_of_rank<W, 2>&& std::is_floating_point_v<scalar_of<W>>;
template <typename W>
constexpr bool is_weights_tensor = is_tensor_of_rank<W, 4>&& std::is_floating_point_v<scalar_of<W>>;

}  // namespace detail

// ---- Public functions -------------------------------------------------------------------------------------

/// \brief A panel of any (rows, columns) matrix, for heatmap_panels_svg: copies the values and labels.
///
/// Shapes: `values` (rows, columns), a `Tensor` or `TensorView` of float or double; `row_labels` rows
/// entries and `column_labels` columns entries, or empty for numbers. Throws ShapeError on a wrong label count.
/// \code
/// MhaForward<float> fwd = mha.forward(x, opts);                 // weights (1, H, L, L)
/// HeatmapPanel p = make_heatmap_panel(fwd.weights[0][2], words, words, "head 2");
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_matrix<W>>>
HeatmapPanel make_heatmap_panel(const W& values, std::vector<std::string> row_labels = {},
                                std::vector<std::string> column_labels = {}, std::string title = {}) {
  const auto m = detail::const_view(values);
  const char* function = "make_heatmap_panel";
  HeatmapPanel p;
  p.title = std::move(title);
  p.rows = m.dim(0);
  p.columns = m.dim(1);
  detail::resolve_labels(function, "row_labels", row_labels, p.rows, "rows");
  detail::resolve_labels(function, "column_labels", column_labels, p.columns, "columns");
  p.row_labels = std::move(row_labels);
  p.column_labels = std::move(column_labels);
  for (Index i = 0; i < p.rows; ++i)
    for (Index j = 0; j < p.columns; ++j) p.values.push_back(static_cast<double>(m(i, j)));
  return p;
}

/// \brief Several matrices in one SVG, in a grid of `options.grid_columns` per row, sharing one colour scale.
///
/// Each panel has its own shape, labels, title and emphasis (HeatmapPanel). `options.allowed` is for the
/// attention functions and must be empty here: set HeatmapPanel::masked instead. Throws ShapeError for
/// panel sizes or label counts that do not match, std::invalid_argument for bad options or indices.
/// \code
/// HeatmapPanel rows = make_heatmap_panel(it_rows, heads, words, "the \"it\" row of every head");
/// HeatmapPanel full = make_heatmap_panel(fwd.weights[0][2], words, words, "head 2");
/// HeatmapOptions opts;
/// opts.grid_columns = 1;   // one above the other
/// std::string svg = heatmap_panels_svg({rows, full}, opts);
/// \endcode
inline std::string heatmap_panels_svg(const std::vector<HeatmapPanel>& panels, const HeatmapOptions& options = {}) {
  if (options.allowed.data())
    detail::throw_invalid("heatmap_panels_svg", "options.allowed", "not used by panels: set HeatmapPanel::masked");
  return detail::render_heatmap_svg("heatmap_panels_svg", panels, options);
}

/// \brief An SVG heatmap of one attention matrix: rows are queries, columns are keys.
///
/// Shapes: `weights` (Lq, Lk), a `Tensor` or `TensorView` of float or double; `query_labels` Lq entries,
/// `key_labels` Lk entries (either may be empty: numbered). `options.allowed`, when set, must broadcast to
/// (1, 1, Lq, Lk). NaN values are drawn as marked cells, never an error. Throws ShapeError naming
/// `query_labels`, `key_labels` or `options.allowed` on a size mismatch, std::invalid_argument on bad options.
/// \code
/// Tensor<float, 2> w({3, 3});                    // e.g. one head of fwd.weights, copied
/// std::vector<std::string> words{"the", "cat", "<eos>"};
/// HeatmapOptions opts;
/// opts.title = "causal attention";
/// opts.zero_is_masked = true;
/// std::string svg = attention_heatmap_svg(w, words, words, opts);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_matrix<W>>>
std::string attention_heatmap_svg(const W& weights, const std::vector<std::string>& query_labels,
                                  const std::vector<std::string>& key_labels, const HeatmapOptions& options = {}) {
  const char* function = "attention_heatmap_svg";
  const auto w = detail::as_single_head(detail::const_view(weights));
  const auto rows = detail::resolve_labels(function, "query_labels", query_labels, w.dim(2), "Lq");
  const auto columns = detail::resolve_labels(function, "key_labels", key_labels, w.dim(3), "Lk");
  if (options.allowed.data())
    detail::check_broadcastable<4>(function, "options.allowed", options.allowed.shape(), w.shape());
  return detail::render_heatmap_svg(function, {detail::head_panel(w, 0, 0, rows, columns, options)}, options);
}

/// \brief An SVG heatmap of head `head` of batch entry `batch` of an attention weights tensor.
///
/// Shapes: `weights` (B, H, Lq, Lk), e.g. `MhaForward::weights` or `AttentionForward::weights`;
/// `query_labels` Lq entries, `key_labels` Lk entries (or empty); `options.allowed` empty or broadcastable
/// to (B, H, Lq, Lk), the same mask the forward used. Throws std::invalid_argument naming `batch` or `head`
/// when out of range, ShapeError on a label count or mask shape that does not match.
/// \code
/// auto fwd = mha.forward(x, opts);                  // opts.need_weights = true
/// write_attention_heatmap_svg("head0.svg", fwd.weights, 0, 0, words, words);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
std::string attention_heatmap_svg(const W& weights, Index batch, Index head,
                                  const std::vector<std::string>& query_labels,
                                  const std::vector<std::string>& key_labels, const HeatmapOptions& options = {}) {
  const char* function = "attention_heatmap_svg";
  const auto w = detail::const_view(weights);
  detail::check_batch_head(function, w.shape(), batch, head);
  const auto rows = detail::resolve_labels(function, "query_labels", query_labels, w.dim(2), "Lq");
  const auto columns = detail::resolve_labels(function, "key_labels", key_labels, w.dim(3), "Lk");
  if (options.allowed.data())
    detail::check_broadcastable<4>(function, "options.allowed", options.allowed.shape(), w.shape());
  return detail::render_heatmap_svg(function, {detail::head_panel(w, batch, head, rows, columns, options)}, options);
}

/// \brief Every head of batch entry `batch` as a grid of heatmaps titled "head h", with one colour scale.
///
/// Shapes: `weights` (B, H, Lq, Lk); `query_labels` Lq entries, `key_labels` Lk entries (or empty);
/// `options.allowed` empty or broadcastable to (B, H, Lq, Lk). `options.grid_columns` heads per row
/// (default ceil(sqrt(H))). Errors as attention_heatmap_svg.
/// \code
/// auto fwd = mha.forward(x, opts);                   // (1, 4, L, L) weights
/// HeatmapOptions grid;
/// grid.title = "all heads";
/// grid.grid_columns = 4;                              // one row of four
/// std::string svg = attention_heads_svg(fwd.weights, 0, words, words, grid);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
std::string attention_heads_svg(const W& weights, Index batch, const std::vector<std::string>& query_labels,
                                const std::vector<std::string>& key_labels, const HeatmapOptions& options = {}) {
  const char* function = "attention_heads_svg";
  const auto w = detail::const_view(weights);
  detail::check_batch(function, w.shape(), batch);
  const auto rows = detail::resolve_labels(function, "query_labels", query_labels, w.dim(2), "Lq");
  const auto columns = detail::resolve_labels(function, "key_labels", key_labels, w.dim(3), "Lk");
  if (options.allowed.data())
    detail::check_broadcastable<4>(function, "options.allowed", options.allowed.shape(), w.shape());
  std::vector<HeatmapPanel> panels;
  for (Index h = 0; h < w.dim(1); ++h) {
    panels.push_back(detail::head_panel(w, batch, h, rows, columns, options));
    panels.back().title = "head " + std::to_string(h);
  }
  return detail::render_heatmap_svg(function, panels, options);
}

/// \brief One attention matrix as CSV (RFC 4180): a header row of key labels after an empty corner field,
/// then one row per query: its label, then its Lk weights.
///
/// Shapes: `weights` (Lq, Lk); labels as attention_heatmap_svg. Labels holding commas, double quotes or line
/// breaks are quoted; values are written in the shortest form that reads back exactly ("nan", "inf" when not
/// finite); lines end in CRLF. Reads straight into pandas: `pd.read_csv(path, index_col=0)`.
/// \code
/// std::string csv = attention_csv(w, {"the", "cat"}, {"the", "cat"});
/// // ",the,cat\r\nthe,1,0\r\ncat,0.25,0.75\r\n"
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_matrix<W>>>
std::string attention_csv(const W& weights, const std::vector<std::string>& query_labels = {},
                          const std::vector<std::string>& key_labels = {}) {
  return detail::csv_of("attention_csv", detail::as_single_head(detail::const_view(weights)), 0, 0, query_labels,
                        key_labels);
}

/// \brief Head `head` of batch entry `batch` of a (B, H, Lq, Lk) weights tensor as CSV; format as above.
/// \code
/// std::string csv = attention_csv(fwd.weights, 0, 2, words, words);   // batch 0, head 2
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
std::string attention_csv(const W& weights, Index batch, Index head, const std::vector<std::string>& query_labels = {},
                          const std::vector<std::string>& key_labels = {}) {
  const auto w = detail::const_view(weights);
  detail::check_batch_head("attention_csv", w.shape(), batch, head);
  return detail::csv_of("attention_csv", w, batch, head, query_labels, key_labels);
}

/// \brief Writes attention_heatmap_svg(weights, query_labels, key_labels, options) to `path`.
///
/// Shapes: `weights` (Lq, Lk). Validates first, so on any error nothing is written. Throws
/// std::runtime_error naming the path when the file cannot be opened or written.
/// \code
/// write_attention_heatmap_svg("matrix.svg", w, words, words, opts);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_matrix<W>>>
void write_attention_heatmap_svg(const std::string& path, const W& weights,
                                 const std::vector<std::string>& query_labels,
                                 const std::vector<std::string>& key_labels, const HeatmapOptions& options = {}) {
  detail::write_text_file("write_attention_heatmap_svg", path,
                          attention_heatmap_svg(weights, query_labels, key_labels, options));
}

/// \brief Writes attention_heatmap_svg(weights, batch, head, query_labels, key_labels, options) to `path`.
///
/// Shapes: `weights` (B, H, Lq, Lk). Errors as the matrix overload above.
/// \code
/// write_attention_heatmap_svg("attention.svg", fwd.weights, 0, 0, words, words, opts);  // batch 0, head 0
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
void write_attention_heatmap_svg(const std::string& path, const W& weights, Index batch, Index head,
                                 const std::vector<std::string>& query_labels,
                                 const std::vector<std::string>& key_labels, const HeatmapOptions& options = {}) {
  detail::write_text_file("write_attention_heatmap_svg", path,
                          attention_heatmap_svg(weights, batch, head, query_labels, key_labels, options));
}

/// \brief Writes attention_heads_svg(weights, batch, query_labels, key_labels, options) to `path`.
///
/// Shapes: `weights` (B, H, Lq, Lk). Errors as write_attention_heatmap_svg.
/// \code
/// write_attention_heads_svg("heads.svg", fwd.weights, 0, words, words);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
void write_attention_heads_svg(const std::string& path, const W& weights, Index batch,
                               const std::vector<std::string>& query_labels, const std::vector<std::string>& key_labels,
                               const HeatmapOptions& options = {}) {
  detail::write_text_file("write_attention_heads_svg", path,
                          attention_heads_svg(weights, batch, query_labels, key_labels, options));
}

/// \brief Writes heatmap_panels_svg(panels, options) to `path`; errors as write_attention_heatmap_svg.
/// \code
/// write_heatmap_panels_svg("panels.svg", {rows, full}, opts);
/// \endcode
inline void write_heatmap_panels_svg(const std::string& path, const std::vector<HeatmapPanel>& panels,
                                     const HeatmapOptions& options = {}) {
  detail::write_text_file("write_heatmap_panels_svg", path, heatmap_panels_svg(panels, options));
}

/// \brief Writes attention_csv(weights, query_labels, key_labels) to `path`.
///
/// Shapes: `weights` (Lq, Lk). Errors as write_attention_heatmap_svg.
/// \code
/// write_attention_csv("matrix.csv", w, words, words);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_matrix<W>>>
void write_attention_csv(const std::string& path, const W& weights, const std::vector<std::string>& query_labels = {},
                         const std::vector<std::string>& key_labels = {}) {
  detail::write_text_file("write_attention_csv", path, attention_csv(weights, query_labels, key_labels));
}

/// \brief Writes attention_csv(weights, batch, head, query_labels, key_labels) to `path`.
///
/// Shapes: `weights` (B, H, Lq, Lk). Errors as write_attention_heatmap_svg.
/// \code
/// write_attention_csv("attention.csv", fwd.weights, 0, 0, words, words);
/// \endcode
template <typename W, typename = std::enable_if_t<detail::is_weights_tensor<W>>>
void write_attention_csv(const std::string& path, const W& weights, Index batch, Index head,
                         const std::vector<std::string>& query_labels = {},
                         const std::vector<std::string>& key_labels = {}) {
  detail::write_text_file("write_attention_csv", path, attention_csv(weights, batch, head, query_labels, key_labels));
}

}  // namespace selfattn
