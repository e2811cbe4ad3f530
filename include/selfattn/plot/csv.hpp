/// \file
/// Attention weights as CSV text (RFC 4180): fields quoted where needed, values in the shortest form that
/// reads back exactly. Internals of attention_csv (plot/heatmap.hpp).
#pragma once

#include <selfattn/plot/panel.hpp>
#include <selfattn/tensor.hpp>

#include <charconv>
#include <cstddef>
#include <string>
#include <vector>

namespace selfattn {
namespace detail {

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

/// Head (b, h) of a (B, H, Lq, Lk) tensor as CSV: the key labels as the header, then a row per query.
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

}  // namespace detail
}  // namespace selfattn
