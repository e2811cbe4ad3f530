/// \file
/// Pictures of attention: attention weights as an SVG heatmap (one head, a grid of heads, or panels of any
/// matrices) and as CSV.
///
/// Every SVG is self-contained (no scripts, no external fonts or files): token labels on both axes (query
/// labels left of the rows, key labels above the columns, rotated by 45 degrees when they are wider than a
/// cell), a title, a colour scale with tick values, optionally the number in each cell. Masked cells are
/// hatched grey and NaN cells pale red with "NaN", each with its swatch in the legend. All text is
/// XML-escaped, so labels such as "<eos>" or "a&b" give valid XML. Functions return the text as a
/// `std::string`; the `write_*` twins write it to a file, atomically (io/atomic_file.hpp: a failed write leaves
/// the old file as it was), and throw `std::runtime_error` when they cannot.
/// Numbers are formatted with `std::to_chars`, so the output does not depend on the C locale.
/// Guide with pictures: docs/pictures.md.
///
/// This header holds the entry points and includes the rest of plot/, one concept a header: the public types
/// in plot/colour_map.hpp (ColourMap), plot/heatmap_options.hpp (HeatmapOptions) and plot/panel.hpp
/// (HeatmapPanel, make_heatmap_panel); the internals in plot/text.hpp (escaping, widths, numbers),
/// plot/layout.hpp (geometry), plot/colour_scale.hpp (range and legend), plot/heatmap_svg.hpp (the SVG
/// document) and plot/csv.hpp.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/io/atomic_file.hpp>
#include <selfattn/plot/colour_map.hpp>
#include <selfattn/plot/csv.hpp>
#include <selfattn/plot/heatmap_options.hpp>
#include <selfattn/plot/heatmap_svg.hpp>
#include <selfattn/plot/panel.hpp>
#include <selfattn/tensor.hpp>

#include <array>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn {
namespace detail {

/// std::invalid_argument naming `batch` when it is not an index of dimension 0 (B) of `shape`.
inline void check_batch(const char* function, const std::array<Index, 4>& shape, Index batch) {
  if (batch < 0 || batch >= shape[0])
    throw_invalid(function, "batch",
                  "expected an index in [0, " + std::to_string(shape[0]) + ") (B), got " + std::to_string(batch));
}

/// As check_batch, and the same for `head` in dimension 1 (H).
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

}  // namespace detail

// ---- Public functions -------------------------------------------------------------------------------------

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
  detail::write_file_atomically("write_attention_heatmap_svg", path,
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
  detail::write_file_atomically("write_attention_heatmap_svg", path,
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
  detail::write_file_atomically("write_attention_heads_svg", path,
                          attention_heads_svg(weights, batch, query_labels, key_labels, options));
}

/// \brief Writes heatmap_panels_svg(panels, options) to `path`; errors as write_attention_heatmap_svg.
/// \code
/// write_heatmap_panels_svg("panels.svg", {rows, full}, opts);
/// \endcode
inline void write_heatmap_panels_svg(const std::string& path, const std::vector<HeatmapPanel>& panels,
                                     const HeatmapOptions& options = {}) {
  detail::write_file_atomically("write_heatmap_panels_svg", path, heatmap_panels_svg(panels, options));
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
  detail::write_file_atomically("write_attention_csv", path, attention_csv(weights, query_labels, key_labels));
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
  detail::write_file_atomically("write_attention_csv", path,
                                attention_csv(weights, batch, head, query_labels, key_labels));
}

}  // namespace selfattn
