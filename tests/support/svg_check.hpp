// tests/support/svg_check.hpp — what the picture tests read back from the SVG text they are given.
//
// A small XML well-formedness checker, enough of XML 1.0 for our output and for catching what breaks it: one root
// element, balanced and properly nested tags, quoted attributes without duplicates, no raw '<' in text or
// attributes, and only the five predefined or numeric entity references. xml_error returns "" when well-formed,
// else what is wrong. Used by heatmap_test.cpp and line_chart_test.cpp.
#pragma once

#include <cctype>
#include <cstddef>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace selfattn::test {

inline bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '-' || c == '.' ||
         static_cast<unsigned char>(c) >= 0x80;
}

inline std::string check_entities(const std::string& text) {
  for (std::size_t at = text.find('&'); at != std::string::npos; at = text.find('&', at + 1)) {
    const std::size_t end = text.find(';', at);
    if (end == std::string::npos) return "'&' without ';'";
    const std::string name = text.substr(at + 1, end - at - 1);
    static const std::set<std::string> predefined{"amp", "lt", "gt", "quot", "apos"};
    const bool numeric = std::regex_match(name, std::regex("#[0-9]+|#x[0-9a-fA-F]+"));
    if (!predefined.count(name) && !numeric) return "unknown entity &" + name + ";";
  }
  return "";
}

inline std::string xml_error(const std::string& xml, int* elements = nullptr) {
  std::vector<std::string> open;
  std::size_t at = 0;
  int roots = 0, count = 0;
  if (xml.compare(0, 5, "<?xml") == 0) {
    at = xml.find("?>");
    if (at == std::string::npos) return "unterminated XML declaration";
    at += 2;
  }
  while (at < xml.size()) {
    const std::size_t lt = xml.find('<', at);
    const std::string text = xml.substr(at, lt == std::string::npos ? std::string::npos : lt - at);
    if (open.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos) return "text outside the root";
    if (const std::string e = check_entities(text); !e.empty()) return "in text: " + e;
    if (lt == std::string::npos) break;
    at = lt;
    if (xml.compare(at, 4, "<!--") == 0) {
      const std::size_t end = xml.find("-->", at);
      if (end == std::string::npos) return "unterminated comment";
      at = end + 3;
      continue;
    }
    const bool closing = xml.compare(at, 2, "</") == 0;
    at += closing ? 2 : 1;
    const std::size_t name_start = at;
    while (at < xml.size() && is_name_char(xml[at])) ++at;
    const std::string name = xml.substr(name_start, at - name_start);
    if (name.empty()) return "a '<' that starts no tag at byte " + std::to_string(name_start);
    if (closing) {
      while (at < xml.size() && std::isspace(static_cast<unsigned char>(xml[at]))) ++at;
      if (at >= xml.size() || xml[at] != '>') return "bad end tag </" + name;
      if (open.empty() || open.back() != name)
        return "end tag </" + name + "> does not close <" + (open.empty() ? std::string("nothing") : open.back()) + ">";
      open.pop_back();
      ++at;
      continue;
    }
    if (open.empty() && ++roots > 1) return "more than one root element";
    ++count;
    std::set<std::string> attributes;
    for (;;) {
      while (at < xml.size() && std::isspace(static_cast<unsigned char>(xml[at]))) ++at;
      if (at >= xml.size()) return "unterminated tag <" + name;
      if (xml.compare(at, 2, "/>") == 0) {
        at += 2;
        break;
      }
      if (xml[at] == '>') {
        open.push_back(name);
        ++at;
        break;
      }
      const std::size_t a = at;
      while (at < xml.size() && is_name_char(xml[at])) ++at;
      const std::string attribute = xml.substr(a, at - a);
      if (attribute.empty() || at >= xml.size() || xml[at] != '=') return "bad attribute in <" + name;
      if (!attributes.insert(attribute).second) return "duplicate attribute " + attribute + " in <" + name;
      ++at;
      if (at >= xml.size() || (xml[at] != '"' && xml[at] != '\'')) return "unquoted attribute " + attribute;
      const char quote = xml[at++];
      const std::size_t end = xml.find(quote, at);
      if (end == std::string::npos) return "unterminated attribute " + attribute;
      const std::string value = xml.substr(at, end - at);
      if (value.find('<') != std::string::npos) return "'<' in attribute " + attribute;
      if (const std::string e = check_entities(value); !e.empty()) return "in attribute " + attribute + ": " + e;
      at = end + 1;
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "no root element";
  if (elements) *elements = count;
  return "";
}

inline std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

inline double svg_attribute(const std::string& svg, const std::string& name) {  // of the root <svg> element
  std::smatch m;
  const std::string root = svg.substr(0, svg.find('>', svg.find("<svg")));
  if (!std::regex_search(root, m, std::regex(" " + name + "=\"([0-9.]+)\""))) return -1;
  return std::stod(m[1]);
}

}  // namespace selfattn::test
