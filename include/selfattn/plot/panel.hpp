/// \file
/// HeatmapPanel, one matrix of a picture with its labels and emphasis: made from any matrix
/// (make_heatmap_panel) or from one head of an attention weights tensor, and validated.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/plot/heatmap_options.hpp>
#include <selfattn/tensor.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

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

/// True for a `Tensor` or `TensorView` of float or double of rank 2 (a matrix) or 4 (B, H, Lq, Lk).
template <typename W>
constexpr bool is_weights_matrix = is_tensor_of_rank<W, 2>&& std::is_floating_point_v<scalar_of<W>>;
template <typename W>
constexpr bool is_weights_tensor = is_tensor_of_rank<W, 4>&& std::is_floating_point_v<scalar_of<W>>;

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

/// std::invalid_argument naming `argument` when an entry of `indices` is not in [0, extent).
inline void check_indices(const char* function, const std::string& argument, const std::vector<Index>& indices,
                          Index extent) {
  for (Index n : indices)
    if (n < 0 || n >= extent)
      throw_invalid(function, argument,
                    "index " + std::to_string(n) + " out of range [0, " + std::to_string(extent) + ")");
}

/// Checks panel `index` of a picture: sizes of values and masked, label counts, emphasised indices.
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

}  // namespace detail

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

}  // namespace selfattn
