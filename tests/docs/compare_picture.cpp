// compare_picture.cpp — is a picture committed under docs/ still what its program writes?
//
//   compare_picture COMMITTED WRITTEN [TOLERANCE]
//
// The examples write their SVGs when ctest runs them; the tests docs_picture_<name> (examples/CMakeLists.txt) hand
// this program the committed copy and the fresh one. Byte-equal files pass. Otherwise the two are read as text
// between numbers: the text (element names, attributes, labels) must be equal, and each number and each channel of a
// #rrggbb colour may differ by at most TOLERANCE (default 1: one pixel of position, one step of 255 in a colour,
// which no reader can see). That is what another CPU may change: a trained model's weights differ by rounding when
// a kernel sums in another order, and a coordinate rounded to 0.1 px can move by one digit. A new element, a lost
// point of a line, other text or an axis that moved is a different picture and fails, printing where.
// Exit 0 when the pictures agree, 1 when they differ, 2 on bad arguments or an unreadable file.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// One piece of an SVG: text up to the next number (or colour), then that number.
struct Piece {
  std::string text;
  std::vector<double> numbers;  // one number, or the three channels of #rrggbb; empty at the end of the file
  std::size_t line = 1;
};

bool read_file(const char* path, std::string& content) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  content = buffer.str();
  return true;
}

bool is_hex_colour(const std::string& s, std::size_t at) {
  if (s[at] != '#' || at + 7 > s.size()) return false;
  for (std::size_t i = at + 1; i < at + 7; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return at + 7 == s.size() || !std::isalnum(static_cast<unsigned char>(s[at + 7]));
}

// A number starts at a digit, or at '-' or '.' followed by one, unless it continues a name (x1, font-family, ...).
bool starts_number(const std::string& s, std::size_t at) {
  const auto digit = [&](std::size_t i) { return i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); };
  if (at > 0 && (std::isalpha(static_cast<unsigned char>(s[at - 1])) || s[at - 1] == '_')) return false;
  if (digit(at)) return true;
  if (s[at] == '-' || s[at] == '.') return digit(at + 1) || (s[at] == '-' && s[at + 1] == '.' && digit(at + 2));
  return false;
}

std::vector<Piece> split(const std::string& s) {
  std::vector<Piece> pieces(1);
  std::size_t line = 1;
  for (std::size_t at = 0; at < s.size();) {
    if (is_hex_colour(s, at)) {
      for (int channel = 0; channel < 3; ++channel) {
        pieces.back().numbers.push_back(std::strtol(s.substr(at + 1 + 2 * channel, 2).c_str(), nullptr, 16));
      }
      pieces.back().text += '#';
      pieces.push_back({"", {}, line});
      at += 7;
    } else if (starts_number(s, at)) {
      char* end = nullptr;
      pieces.back().numbers.push_back(std::strtod(s.c_str() + at, &end));
      pieces.push_back({"", {}, line});
      at = static_cast<std::size_t>(end - s.c_str());
    } else {
      if (s[at] == '\n') ++line;
      pieces.back().text += s[at++];
    }
  }
  return pieces;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s COMMITTED WRITTEN [TOLERANCE]\n", argv[0]);
    return 2;
  }
  const double tolerance = argc == 4 ? std::atof(argv[3]) : 1.0;
  std::string committed, written;
  for (const auto& [path, content] : {std::pair{argv[1], &committed}, std::pair{argv[2], &written}}) {
    if (!read_file(path, *content)) {
      std::fprintf(stderr, "compare_picture: cannot read %s\n", path);
      return 2;
    }
  }
  const auto fail = [&](std::size_t line, const char* what) {
    std::fprintf(stderr,
                 "%s differs from what its program wrote (%s) at line %zu: %s.\n"
                 "If the change is meant, copy the new picture over the committed one:\n  cp %s %s\n",
                 argv[1], argv[2], line, what, argv[2], argv[1]);
    return 1;
  };
  if (committed == written) {
    std::printf("%s: identical to %s\n", argv[1], argv[2]);
    return 0;
  }
  const std::vector<Piece> a = split(committed), b = split(written);
  double largest = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].text != b[i].text) return fail(b[i].line, "other text or elements");
    if (a[i].numbers.size() != b[i].numbers.size()) return fail(b[i].line, "a number where the other has a colour");
    for (std::size_t k = 0; k < a[i].numbers.size(); ++k) {
      const double difference = std::fabs(a[i].numbers[k] - b[i].numbers[k]);
      if (!(difference <= tolerance)) {
        std::fprintf(stderr, "  %g against %g\n", a[i].numbers[k], b[i].numbers[k]);
        return fail(b[i].line, "a number or colour moved by more than the tolerance");
      }
      if (difference > largest) largest = difference;
    }
  }
  if (a.size() != b.size()) return fail(std::min(a.back().line, b.back().line), "one picture has more elements");
  std::printf("%s: the same picture as %s (%zu numbers, each within %g; the largest difference %g)\n", argv[1], argv[2],
              a.size() - 1, tolerance, largest);
  return 0;
}
