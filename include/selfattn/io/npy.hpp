/// \file
/// NumPy `.npy` files: read (format versions 1.0, 2.0 and 3.0; little-endian float16, float32 and float64; C
/// or Fortran order) and write (version 1.0, or 2.0 when the header needs it), from a path or from bytes in
/// memory, plus `NdArray`, the dynamic-rank array a file holds before it is given a static rank.
///
/// The file layout (numpy/lib/format.py, NEP 1):
///
///     "\x93NUMPY" major minor | header length (2 bytes LE in 1.0, 4 bytes LE in 2.0/3.0) | header | data
///
/// The header is a Python dict literal, `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`,
/// padded with spaces and a newline. It is read by a small strict parser of exactly that grammar (strings
/// without escapes, True/False, tuples of non-negative decimal integers), never by a general evaluator, so
/// malformed bytes give a FormatError and can do nothing else. Every length in the file is checked against
/// the bytes actually present before anything is read or allocated: allocations never exceed the input size.
///
/// Element types: float, double, Eigen::half and Eigen::bfloat16, from any of the three file dtypes.
/// - '<f2' (float16) into Eigen::half copies the 16 bits; '<f4' into float and '<f8' into double copy too.
/// - Widening is exact: '<f2' into float or double (float holds every float16 value), '<f4' into double.
/// - Narrowing rounds once, to nearest with ties to even: '<f8' into float; '<f4' or '<f8' into Eigen::half
///   or Eigen::bfloat16; '<f2' into Eigen::bfloat16 (8 significant bits against float16's 11). float64 is
///   narrowed to float rounding to odd first, which makes the second rounding the correctly rounded result
///   (no double rounding; PyTorch 1.13's float64 -> float16 does round twice, NumPy's does not). Overflow
///   gives an infinity, underflow a subnormal or a signed zero; NaN stays NaN of the same sign (its payload
///   is not guaranteed).
/// - NumPy has no bfloat16 dtype, so encode_npy / write_npy write a bfloat16 tensor as '<f4' (float32). That
///   is exact (every bfloat16 is a float32 with 16 zero low bits: it *is* PyTorch's `t.float().numpy()`),
///   every NumPy reads it, and reading the file back into Eigen::bfloat16 gives the same bits (NaN payloads
///   aside). The price is 4 bytes per element instead of 2; for 2-byte bfloat16 storage use .safetensors
///   (dtype BF16).
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/io/atomic_file.hpp>
#include <selfattn/tensor.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace selfattn {

/// \brief Thrown for a malformed, truncated or unsupported `.npy` or `.safetensors` file; an
/// `std::invalid_argument`. The message starts with the function and the file (or `<memory>`).
class FormatError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// \brief A dynamic-rank, owning, row-major (C order) array: what a file holds before it is given a static rank.
///
/// shape: any rank, including 0 (a scalar, one value); values: product(shape) elements in row-major order.
/// \code
/// NdArray<float> a = read_npy_array<float>("weights.npy");
/// Tensor<float, 2> w = to_tensor<2>(a, "weights.npy");   // throws ShapeError unless a is 2-D
/// \endcode
template <typename T>
struct NdArray {
  std::vector<Index> shape;  ///< extents, outermost first; empty for a 0-d array
  std::vector<T> values;     ///< row-major elements; size() of them

  /// Number of elements: the product of the extents (1 for a 0-d array).
  Index size() const {
    Index n = 1;
    for (Index extent : shape) n *= extent;
    return n;
  }
};

/// \brief A state dict: parameter name -> dynamic-rank array, as PyTorch's `module.state_dict()` holds them
/// (see io/state_dict.hpp for nn.MultiheadAttention's names).
template <typename T>
using StateDict = std::map<std::string, NdArray<T>>;

namespace detail {

inline std::string dynamic_shape_string(const std::vector<Index>& shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(shape[d]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

inline bool has_prefix(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

[[noreturn]] inline void throw_format(const char* function, const std::string& source, const std::string& message) {
  throw FormatError(std::string("[") + function + "] " + source + ": " + message);
}

/// Element count of `shape`, or a FormatError when it overflows. Zero extents count as 1 in the overflow
/// test, so that every partial product Tensor and TensorView later form (strides) is representable too.
inline Index checked_element_count(const char* function, const std::string& source, const std::vector<Index>& shape) {
  constexpr Index max = std::numeric_limits<Index>::max();
  Index bound = 1;
  bool any_zero = false;
  for (Index extent : shape) {
    if (extent < 0) throw_format(function, source, "negative extent in shape " + dynamic_shape_string(shape));
    if (extent == 0) {
      any_zero = true;
      continue;
    }
    if (bound > max / extent) throw_format(function, source, "shape " + dynamic_shape_string(shape) + " overflows the element count");
    bound *= extent;
  }
  return any_zero ? 0 : bound;
}

// Little-endian loads and stores through integers, so the result does not depend on the host's byte order
// and no pointer is ever dereferenced at a misaligned address.
inline std::uint64_t load_le(const unsigned char* p, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}
inline void store_le(std::string& out, std::uint64_t v, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
inline float load_f32(const unsigned char* p) {
  const auto bits = static_cast<std::uint32_t>(load_le(p, 4));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline double load_f64(const unsigned char* p) {
  const std::uint64_t bits = load_le(p, 8);
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

/// IEEE binary16 -> float, exactly: normals rebias the exponent (15 -> 127), subnormals are mantissa * 2^-24.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  std::uint32_t bits = exponent == 0x1f ? (sign | 0x7f800000u | (mantissa << 13))  // inf, NaN (payload kept)
                                        : (sign | ((exponent + 112u) << 23) | (mantissa << 13));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// bfloat16 -> float: bfloat16 is the top half of a float32.
inline float bfloat16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The element types the file readers and writers accept.
template <typename T>
constexpr bool is_file_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                 std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>;

/// The unsigned integer as wide as a file element type, to move its bits without converting its value.
template <typename T>
using element_bits_t =
    std::conditional_t<sizeof(T) == 2, std::uint16_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;

template <typename T>
element_bits_t<T> element_bits(const T& value) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == sizeof(element_bits_t<T>), "a 2, 4 or 8 byte float type");
  element_bits_t<T> bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

template <typename T>
T element_from_bits(element_bits_t<T> bits) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == sizeof(element_bits_t<T>), "a 2, 4 or 8 byte float type");
  T value;
  // Through void*: g++'s -Wclass-memaccess objects to Eigen::half's user-provided default constructor, but the
  // type is trivially copyable (asserted above), which is all memcpy needs.
  std::memcpy(static_cast<void*>(&value), &bits, sizeof bits);
  return value;
}

/// The floating-point encodings stored in .npy ('<f2', '<f4', '<f8') and .safetensors (F16, BF16, F32, F64).
enum class StoredFloat { float16, bfloat16, float32, float64 };

/// One little-endian stored element at `p`, as T: the bits themselves when T is the stored type, else the
/// value converted (exactly when T can hold it, else rounded once to nearest even; see the file comment).
template <typename T>
T decode_stored_float(StoredFloat kind, const unsigned char* p) {
  switch (kind) {
    case StoredFloat::float16: {
      const auto bits = static_cast<std::uint16_t>(load_le(p, 2));
      if constexpr (std::is_same_v<T, Eigen::half>)
        return element_from_bits<Eigen::half>(bits);
      else  // float16 -> float is exact, so this is one rounding at most
        return narrow<T>(half_to_float(bits));
    }
    case StoredFloat::bfloat16: {
      const auto bits = static_cast<std::uint16_t>(load_le(p, 2));
      if constexpr (std::is_same_v<T, Eigen::bfloat16>)
        return element_from_bits<Eigen::bfloat16>(bits);
      else
        return narrow<T>(bfloat16_to_float(bits));
    }
    case StoredFloat::float32:
      return narrow<T>(load_f32(p));
    case StoredFloat::float64:
      break;
  }
  return narrow<T>(load_f64(p));
}

/// Reads a whole file into memory; std::runtime_error when it cannot (an I/O error, not a format error).
inline std::string read_binary_file(const char* function, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("[") + function + "] cannot open '" + path + "' for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error(std::string("[") + function + "] error while reading '" + path + "'");
  return bytes;
}

/// Strict parser of the .npy header dict (see the file comment for the grammar).
class NpyDictParser {
 public:
  NpyDictParser(const char* begin, const char* end, const std::string& source) : p_(begin), begin_(begin), end_(end), source_(source) {}

  struct Result {
    std::string descr;
    bool fortran_order = false;
    std::vector<Index> shape;
  };

  Result parse() {
    Result r;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    expect('{', "the header dict");
    skip_space();
    while (!consume('}')) {
      const std::string key = parse_string("a key");
      skip_space();
      expect(':', "after key '" + key + "'");
      skip_space();
      const auto mark_once = [&](bool& seen) {
        if (seen) fail("duplicate key '" + key + "'");
        seen = true;
      };
      if (key == "descr") {
        mark_once(have_descr);
        if (at_end() || (*p_ != '\'' && *p_ != '"'))
          fail("descr: expected a dtype string such as '<f4' (structured dtypes are not supported)");
        r.descr = parse_string("descr");
      } else if (key == "fortran_order") {
        mark_once(have_fortran);
        r.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_once(have_shape);
        r.shape = parse_shape();
      } else {
        fail("unexpected key '" + key + "' (a .npy header has exactly descr, fortran_order, shape)");
      }
      skip_space();
      if (consume(',')) {
        skip_space();
        continue;
      }
      expect('}', "after the value of '" + key + "' (',' or '}')");
      break;
    }
    skip_space();
    if (!at_end()) fail("unexpected text after the header dict");
    if (!have_descr) fail("missing key 'descr'");
    if (!have_fortran) fail("missing key 'fortran_order'");
    if (!have_shape) fail("missing key 'shape'");
    return r;
  }

 private:
  static constexpr std::size_t max_rank = 64;  // NumPy 2's NPY_MAXDIMS; 1.x allows 32

  [[noreturn]] void fail(const std::string& what) const {
    throw_format("parse_npy", source_, "bad header at byte " + std::to_string(p_ - begin_) + " of the dict: " + what);
  }
  bool at_end() const { return p_ == end_; }
  void skip_space() {
    while (!at_end() && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool consume(char c) {
    if (at_end() || *p_ != c) return false;
    ++p_;
    return true;
  }
  void expect(char c, const std::string& where) {
    if (!consume(c)) fail(std::string("expected '") + c + "' " + where);
  }
  std::string parse_string(const std::string& what) {
    if (at_end() || (*p_ != '\'' && *p_ != '"')) fail("expected a quoted string for " + what);
    const char quote = *p_++;
    std::string text;
    while (!at_end() && *p_ != quote) {
      if (*p_ == '\\') fail("escape sequences in strings are not supported");
      if (*p_ == '\n') fail("unterminated string");
      text += *p_++;
    }
    if (at_end()) fail("unterminated string");
    ++p_;
    return text;
  }
  bool parse_bool() {
    const auto word = [&](const char* w) {
      const std::size_t n = std::strlen(w);
      if (static_cast<std::size_t>(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
      const char* after = p_ + n;
      if (after != end_ && (std::isalnum(static_cast<unsigned char>(*after)) || *after == '_')) return false;
      p_ = after;
      return true;
    };
    if (word("True")) return true;
    if (word("False")) return false;
    fail("fortran_order: expected True or False");
  }
  Index parse_extent() {
    if (!at_end() && *p_ == '-') fail("shape: extents must be non-negative");
    if (at_end() || *p_ < '0' || *p_ > '9') fail("shape: expected a non-negative integer");
    if (*p_ == '0' && p_ + 1 != end_ && p_[1] >= '0' && p_[1] <= '9') fail("shape: integer with a leading zero");
    Index v = 0;
    while (!at_end() && *p_ >= '0' && *p_ <= '9') {
      const Index digit = *p_ - '0';
      if (v > (std::numeric_limits<Index>::max() - digit) / 10) fail("shape: extent too large");
      v = v * 10 + digit;
      ++p_;
    }
    return v;
  }
  // Python tuples: (), (a,), (a, b), (a, b,). "(a)" is an int in parentheses, not a tuple.
  std::vector<Index> parse_shape() {
    expect('(', "to open the shape tuple");
    std::vector<Index> shape;
    skip_space();
    if (consume(')')) return shape;
    for (;;) {
      if (shape.size() == max_rank) fail("shape: more than " + std::to_string(max_rank) + " dimensions");
      shape.push_back(parse_extent());
      skip_space();
      if (consume(',')) {
        skip_space();
        if (consume(')')) return shape;
        continue;
      }
      if (consume(')')) {
        if (shape.size() == 1) fail("shape: (n) is not a tuple, a 1-d shape is written (n,)");
        return shape;
      }
      fail("shape: expected ',' or ')'");
    }
  }

  const char* p_;
  const char* begin_;
  const char* end_;
  const std::string& source_;
};

}  // namespace detail

/// \brief What a `.npy` header says, validated against the bytes that follow it.
struct NpyHeader {
  int major_version = 1;          ///< 1, 2 or 3 (minor version is always 0)
  std::string descr;              ///< "<f2", "<f4" or "<f8": the only dtypes accepted
  std::size_t item_size = 4;      ///< bytes per element: 2, 4 or 8
  bool fortran_order = false;     ///< true: data in column-major order (readers transpose to C order)
  std::vector<Index> shape;       ///< extents; empty for a 0-d array
  Index element_count = 1;        ///< product of the extents
  std::size_t data_offset = 0;    ///< bytes from the start of the file to the first element
};

/// \brief Parses and validates the header of a `.npy` file held in memory: magic, version, dict, dtype, and
/// that exactly element_count * item_size bytes of data follow. Throws FormatError otherwise; never reads
/// outside [data, data + size).
///
/// \code
/// NpyHeader h = parse_npy_header(bytes.data(), bytes.size());   // h.shape, h.descr, h.fortran_order
/// \endcode
inline NpyHeader parse_npy_header(const char* data, std::size_t size, const std::string& source = "<memory>") {
  const char* fn = "parse_npy";
  static constexpr char magic[] = "\x93NUMPY";
  constexpr std::size_t magic_size = sizeof magic - 1;
  if (data == nullptr && size > 0) detail::throw_format(fn, source, "null data pointer");
  const std::size_t compared = std::min(size, magic_size);
  if (compared > 0 && std::memcmp(data, magic, compared) != 0)
    detail::throw_format(fn, source, "not a .npy file (it does not start with \\x93NUMPY)");
  if (size < magic_size + 2)
    detail::throw_format(fn, source, "truncated: " + std::to_string(size) + " bytes, shorter than the .npy preamble");
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  NpyHeader h;
  h.major_version = bytes[magic_size];
  const int minor = bytes[magic_size + 1];
  if (h.major_version < 1 || h.major_version > 3 || minor != 0)
    detail::throw_format(fn, source,
                         "unsupported format version " + std::to_string(h.major_version) + "." + std::to_string(minor) +
                             " (expected 1.0, 2.0 or 3.0)");
  const std::size_t length_bytes = h.major_version == 1 ? 2 : 4;
  const std::size_t prefix = magic_size + 2 + length_bytes;
  if (size < prefix) detail::throw_format(fn, source, "truncated inside the header length field");
  const std::size_t header_length = static_cast<std::size_t>(detail::load_le(bytes + magic_size + 2, length_bytes));
  if (header_length > size - prefix)
    detail::throw_format(fn, source,
                         "truncated: the header length is " + std::to_string(header_length) + " bytes but only " +
                             std::to_string(size - prefix) + " follow the preamble");

  detail::NpyDictParser::Result dict = detail::NpyDictParser(data + prefix, data + prefix + header_length, source).parse();
  if (dict.descr == "<f2") {
    h.item_size = 2;
  } else if (dict.descr == "<f4") {
    h.item_size = 4;
  } else if (dict.descr == "<f8") {
    h.item_size = 8;
  } else {
    detail::throw_format(fn, source,
                         "unsupported dtype '" + dict.descr +
                             "': expected '<f2', '<f4' or '<f8' (little-endian float16, float32 or float64); convert "
                             "with arr.astype('<f4') in NumPy");
  }
  h.descr = std::move(dict.descr);
  h.fortran_order = dict.fortran_order;
  h.shape = std::move(dict.shape);
  h.element_count = detail::checked_element_count(fn, source, h.shape);
  h.data_offset = prefix + header_length;

  const std::size_t available = size - h.data_offset;
  const auto count = static_cast<std::size_t>(h.element_count);
  if (count > available / h.item_size)  // no multiplication: count * item_size may not fit
    detail::throw_format(fn, source,
                         "truncated data: shape " + detail::dynamic_shape_string(h.shape) + " of " + h.descr + " needs " +
                             std::to_string(count) + " x " + std::to_string(h.item_size) + " bytes, but only " +
                             std::to_string(available) + " follow the header");
  if (count * h.item_size != available)
    detail::throw_format(fn, source,
                         std::to_string(available - count * h.item_size) + " unexpected bytes after the data of shape " +
                             detail::dynamic_shape_string(h.shape));
  return h;
}

/// \brief Decodes a whole `.npy` file held in memory into an NdArray<T> in C order; T is float, double,
/// Eigen::half or Eigen::bfloat16.
///
/// float16, float32 and float64 data all convert to T: bit for bit when the file holds T's own format ('<f2'
/// into Eigen::half), exactly when T is wider, rounded once to nearest even when it is narrower (see the file
/// comment). Fortran-order data is transposed into C order, so `values` is always row-major. Throws
/// FormatError for anything malformed.
/// \code
/// std::string bytes = ...;                          // a whole .npy file
/// NdArray<double> a = parse_npy_array<double>(bytes.data(), bytes.size());
/// \endcode
template <typename T>
NdArray<T> parse_npy_array(const char* data, std::size_t size, const std::string& source = "<memory>") {
  static_assert(detail::is_file_element<T>,
                "parse_npy_array<T>: T is float, double, Eigen::half or Eigen::bfloat16");
  const NpyHeader h = parse_npy_header(data, size, source);
  const detail::StoredFloat stored = h.item_size == 2   ? detail::StoredFloat::float16
                                     : h.item_size == 4 ? detail::StoredFloat::float32
                                                        : detail::StoredFloat::float64;
  NdArray<T> a;
  a.shape = h.shape;
  const auto count = static_cast<std::size_t>(h.element_count);
  a.values.resize(count);  // count * item_size bytes are present: the allocation is bounded by the input
  const auto* bytes = reinterpret_cast<const unsigned char*>(data) + h.data_offset;
  const auto load = [&](std::size_t n) { return detail::decode_stored_float<T>(stored, bytes + n * h.item_size); };
  if (!h.fortran_order || h.shape.size() < 2) {  // rank 0 and 1: both orders are the same
    for (std::size_t n = 0; n < count; ++n) a.values[n] = load(n);
    return a;
  }
  // Fortran order: element (i_0, ..., i_{r-1}) sits at sum_d i_d * prod_{e<d} shape_e. Walk the C-order
  // indices with an odometer (last index fastest) and gather.
  const std::size_t rank = h.shape.size();
  std::vector<std::size_t> f_stride(rank), at(rank, 0);
  std::size_t step = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    f_stride[d] = step;
    step *= static_cast<std::size_t>(h.shape[d]);
  }
  std::size_t source_index = 0;
  for (std::size_t n = 0; n < count; ++n) {
    a.values[n] = load(source_index);
    for (std::size_t d = rank; d-- > 0;) {  // increment the odometer
      source_index += f_stride[d];
      if (++at[d] < static_cast<std::size_t>(h.shape[d])) break;
      source_index -= at[d] * f_stride[d];
      at[d] = 0;
    }
  }
  return a;
}

/// \brief Gives an NdArray a static rank: a Tensor<T, Rank> of the same shape and values.
///
/// The array's rank must be Rank, except that a 0-d array (a scalar) becomes a Tensor<T, 1> of shape (1)
/// (Tensor has no rank 0). Throws ShapeError naming `name` otherwise.
/// \code
/// Tensor<float, 2> w = to_tensor<2>(read_npy_array<float>("w.npy"), "w.npy");
/// \endcode
template <int Rank, typename T>
Tensor<T, Rank> to_tensor(const NdArray<T>& array, const std::string& name = "array") {
  std::array<Index, Rank> shape{};
  if (Rank == 1 && array.shape.empty()) {
    shape[0] = 1;
  } else {
    if (array.shape.size() != static_cast<std::size_t>(Rank))
      throw ShapeError("[to_tensor] " + name + ": expected rank " + std::to_string(Rank) + ", got shape " +
                       detail::dynamic_shape_string(array.shape));
    for (std::size_t d = 0; d < shape.size(); ++d) shape[d] = array.shape[d];
  }
  if (static_cast<std::size_t>(detail::product<Rank>(shape)) != array.values.size())
    throw ShapeError("[to_tensor] " + name + ": shape " + detail::dynamic_shape_string(array.shape) + " does not match its " +
                     std::to_string(array.values.size()) + " values");
  Tensor<T, Rank> t(shape);
  std::copy(array.values.begin(), array.values.end(), t.data());
  return t;
}

/// \brief Decodes a `.npy` file held in memory into a Tensor<T, Rank>: parse_npy_array then to_tensor.
///
/// Throws FormatError for a malformed file, ShapeError when its rank is not Rank.
/// \code
/// Tensor<float, 3> x = parse_npy<float, 3>(bytes.data(), bytes.size());
/// \endcode
template <typename T, int Rank>
Tensor<T, Rank> parse_npy(const char* data, std::size_t size, const std::string& source = "<memory>") {
  return to_tensor<Rank>(parse_npy_array<T>(data, size, source), source);
}

/// \brief Reads a `.npy` file into an NdArray<T> (any rank). I/O failures throw std::runtime_error.
template <typename T>
NdArray<T> read_npy_array(const std::string& path) {
  const std::string bytes = detail::read_binary_file("read_npy", path);
  return parse_npy_array<T>(bytes.data(), bytes.size(), path);
}

/// \brief Reads a `.npy` file into a Tensor<T, Rank> (T float, double, Eigen::half or Eigen::bfloat16; the file
/// float16, float32 or float64, converted as parse_npy_array says).
///
/// \code
/// Tensor<float, 3> x = read_npy<float, 3>("input.npy");   // (B, L, E), saved by np.save
/// \endcode
template <typename T, int Rank>
Tensor<T, Rank> read_npy(const std::string& path) {
  return to_tensor<Rank>(read_npy_array<T>(path), path);
}

/// \brief Encodes a tensor or view (any strides) as the bytes of a `.npy` file: format 1.0 (2.0 if the header
/// exceeds 65535 bytes), C order, header padded to 64 bytes as NumPy writes it.
///
/// The dtype is the element type's: '<f4' for float, '<f8' for double, '<f2' for Eigen::half (the bits as
/// they are). Eigen::bfloat16 is written as '<f4', exactly, because NumPy has no bfloat16 dtype (see the file
/// comment); read_npy<Eigen::bfloat16, R> gives the same bits back.
/// \code
/// std::string bytes = encode_npy(x);   // np.load(io.BytesIO(bytes)) gives x back
/// \endcode
template <typename X, typename = std::enable_if_t<detail::tensor_traits<std::decay_t<X>>::is_tensor>>
std::string encode_npy(const X& tensor) {
  using T = detail::scalar_of<X>;
  static_assert(detail::is_file_element<T>, "encode_npy: element type float, double, Eigen::half or Eigen::bfloat16");
  constexpr bool widen_to_float32 = std::is_same_v<T, Eigen::bfloat16>;  // NumPy has no bfloat16
  constexpr std::size_t item_size = widen_to_float32 ? 4 : sizeof(T);
  constexpr int rank = detail::tensor_traits<std::decay_t<X>>::rank;
  const auto view = detail::const_view(tensor);
  const char* descr = item_size == 2 ? "<f2" : item_size == 4 ? "<f4" : "<f8";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (int d = 0; d < rank; ++d) dict += std::to_string(view.dim(d)) + (rank == 1 || d + 1 < rank ? "," : "") + (d + 1 < rank ? " " : "");
  dict += "), }";
  // Pad with spaces and end with '\n' so that the data starts at a multiple of 64 bytes.
  const auto padded = [&dict](std::size_t prefix) {
    const std::size_t unpadded = prefix + dict.size() + 1;
    return dict.size() + 1 + (64 - unpadded % 64) % 64;
  };
  const bool version2 = padded(10) > 0xffff;
  const std::size_t header_length = padded(version2 ? 12 : 10);
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(version2 ? 2 : 1));
  out.push_back('\0');
  detail::store_le(out, header_length, version2 ? 4 : 2);
  out += dict;
  out.append(header_length - dict.size() - 1, ' ');
  out.push_back('\n');
  out.reserve(out.size() + static_cast<std::size_t>(view.size()) * item_size);
  const Tensor<T, rank> dense(view);  // gathers any strides into row-major order
  for (Index n = 0; n < dense.size(); ++n) {
    if constexpr (widen_to_float32)
      detail::store_le(out, detail::element_bits(static_cast<float>(dense.data()[n])), 4);  // exact
    else
      detail::store_le(out, detail::element_bits(dense.data()[n]), item_size);
  }
  return out;
}

/// \brief Writes a tensor or view (float, double, Eigen::half; Eigen::bfloat16 as float32) to a `.npy` file
/// that `np.load` reads (see encode_npy).
/// The file is replaced atomically (io/atomic_file.hpp): a failed write throws std::runtime_error and leaves the
/// old file as it was, byte for byte.
/// \code
/// write_npy("output.npy", fwd.output);
/// \endcode
template <typename X, typename = std::enable_if_t<detail::tensor_traits<std::decay_t<X>>::is_tensor>>
void write_npy(const std::string& path, const X& tensor) {
  detail::write_file_atomically("write_npy", path, encode_npy(tensor));
}

}  // namespace selfattn
