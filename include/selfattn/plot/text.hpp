/// \file
/// Text in the pictures: XML escaping (invalid UTF-8 and control characters cleaned), estimated text widths,
/// locale-free numbers for cell values and SVG coordinates, and the SVG `<text>` element every label is drawn
/// with. Internals of plot/heatmap.hpp.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <system_error>

namespace selfattn {
namespace detail {

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

/// Appends `<text>` at (x, y) in `size` px with extra `attributes` (may be empty); `text` is XML-escaped.
inline void svg_text(std::string& out, double x, double y, double size, const std::string& attributes,
                     const std::string& text) {
  out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) + "\"" +
         (attributes.empty() ? "" : " " + attributes) + ">" + xml_escape(text) + "</text>\n";
}

}  // namespace detail
}  // namespace selfattn
