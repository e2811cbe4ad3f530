/// \file
/// `.safetensors` files (Hugging Face's checkpoint format): read from a path or from bytes in memory, and
/// write. Needs nlohmann/json (Debian: nlohmann-json3-dev), an optional dependency: without
/// `<nlohmann/json.hpp>` on the include path this header defines `SELFATTN_HAS_SAFETENSORS` as 0 and
/// nothing else. The umbrella selfattn/selfattn.hpp does not include it (nlohmann/json adds seconds to every
/// translation unit): include it where you read checkpoints.
///
/// The file layout (https://github.com/huggingface/safetensors):
///
///     N (8 bytes, unsigned little-endian) | N bytes of JSON header | data section
///
/// The header maps each tensor name to `{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}`
/// (byte offsets into the data section), plus an optional `"__metadata__"` object of strings. Reading
/// validates everything before any tensor is touched, as the reference implementation does: the header
/// length fits in the file, the JSON is an object of well-formed entries, every dtype is known, every
/// shape's element count fits in Index, end - begin is exactly count * dtype size, and the tensors tile the
/// data section with neither overlap nor hole. Any failure throws FormatError (an std::invalid_argument).
///
/// Conversions, to the element type asked for (float, double, Eigen::half or Eigen::bfloat16):
/// - the file's own format is copied bit for bit: F32 into float, F64 into double, F16 into Eigen::half,
///   BF16 into Eigen::bfloat16;
/// - widening is exact: F16 and BF16 into float or double (subnormals, infinities, NaN and -0 kept), F32
///   into double;
/// - anything else rounds once to nearest, ties to even: F64 into float; F32 and F64 into Eigen::half or
///   Eigen::bfloat16; F16 into Eigen::bfloat16 and BF16 into Eigen::half (through float, which holds both
///   exactly, so the only rounding is the last). F64 into a 16-bit type is correctly rounded, not rounded
///   twice (see selfattn/io/npy.hpp). Overflow gives an infinity; NaN stays NaN of the same sign (its payload
///   is not guaranteed).
/// Other dtypes (integer, BOOL, FP8) may be present in a file, but reading them as floating point throws
/// FormatError. The writer stores float as F32, double as F64, Eigen::half as F16 and Eigen::bfloat16 as
/// BF16, bit for bit, so every tensor reads back identical.
#pragma once

#include <selfattn/errors.hpp>
#include <selfattn/io/atomic_file.hpp>
#include <selfattn/io/npy.hpp>
#include <selfattn/tensor.hpp>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

/// 1 when `<nlohmann/json.hpp>` is available and selfattn/io/safetensors.hpp defines its API, else 0.
#define SELFATTN_HAS_SAFETENSORS 1

namespace selfattn {

/// \brief One tensor's entry in a `.safetensors` header, validated.
struct SafetensorsTensorInfo {
  std::string dtype;           ///< "F32", "F64", "F16", "BF16", or another safetensors dtype (not readable as float)
  std::size_t item_size = 0;   ///< bytes per element of dtype
  std::vector<Index> shape;    ///< extents; empty for a 0-d tensor
  std::size_t begin = 0;       ///< first byte in the data section
  std::size_t end = 0;         ///< one past the last byte in the data section
};

namespace detail {

/// Size in bytes of a safetensors dtype, 0 when the name is unknown.
inline std::size_t safetensors_item_size(const std::string& dtype) {
  static const std::pair<const char*, std::size_t> table[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  for (const auto& entry : table)
    if (dtype == entry.first) return entry.second;
  return 0;
}

/// The stored encoding of a floating-point dtype name; empty for any other dtype (integers, BOOL, FP8).
inline std::optional<StoredFloat> stored_float_of_dtype(const std::string& dtype) {
  if (dtype == "F32") return StoredFloat::float32;
  if (dtype == "F64") return StoredFloat::float64;
  if (dtype == "F16") return StoredFloat::float16;
  if (dtype == "BF16") return StoredFloat::bfloat16;
  return std::nullopt;
}

/// The safetensors dtype a file element type is written as.
template <typename T>
constexpr const char* safetensors_dtype_of() {
  static_assert(is_file_element<T>, "SafetensorsWriter: float, double, Eigen::half or Eigen::bfloat16 tensors");
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "F16";
  else return "BF16";
}

inline std::uint64_t json_unsigned(const char* fn, const std::string& source, const nlohmann::json& value,
                                   const std::string& what) {
  // The type name, never value.dump(): dumping recurses, and a hostile header can nest arrays very deeply.
  if (!value.is_number_unsigned())
    throw_format(fn, source,
                 what + ": expected a non-negative integer, got " +
                     (value.is_number_integer() ? std::string("a negative integer") : std::string(value.type_name())));
  return value.get<std::uint64_t>();
}

}  // namespace detail

/// \brief A parsed, validated `.safetensors` file held in memory; tensors are decoded on request.
///
/// \code
/// SafetensorsFile f = read_safetensors("mha.safetensors");
/// for (const std::string& name : f.names()) std::printf("%s %s\n", name.c_str(), f.info(name).dtype.c_str());
/// Tensor<float, 2> w = f.tensor<float, 2>("in_proj_weight");    // (3E, E)
/// NdArray<double> b = f.array<double>("in_proj_bias");          // any rank
/// \endcode
class SafetensorsFile {
 public:
  /// An empty file: no tensors, no metadata.
  SafetensorsFile() = default;

  /// Parses and validates a whole file held in `bytes` (which it keeps). Throws FormatError.
  explicit SafetensorsFile(std::string bytes, const std::string& source = "<memory>")
      : bytes_(std::move(bytes)), source_(source) {
    parse();
  }

  /// Tensor names in lexicographic order (not "__metadata__").
  std::vector<std::string> names() const {
    std::vector<std::string> result;
    result.reserve(tensors_.size());
    for (const auto& entry : tensors_) result.push_back(entry.first);
    return result;
  }
  /// Whether the file has a tensor called `name`.
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  /// The entry of `name`; std::invalid_argument when there is no such tensor.
  const SafetensorsTensorInfo& info(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
      throw std::invalid_argument("[SafetensorsFile] " + source_ + ": no tensor named '" + name + "'");
    return it->second;
  }
  /// The `__metadata__` strings (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The file (or "<memory>") it was read from, as used in error messages.
  const std::string& source() const { return source_; }

  /// Tensor `name` as an NdArray<T> of any rank (T float, double, Eigen::half or Eigen::bfloat16), from F32,
  /// F64, F16 or BF16: bit for bit when the dtype is T's own, else converted as the file comment says.
  template <typename T>
  NdArray<T> array(const std::string& name) const {
    static_assert(detail::is_file_element<T>,
                  "SafetensorsFile::array<T>: T is float, double, Eigen::half or Eigen::bfloat16");
    const SafetensorsTensorInfo& entry = info(name);
    const std::optional<detail::StoredFloat> stored = detail::stored_float_of_dtype(entry.dtype);
    if (!stored)
      detail::throw_format("SafetensorsFile::array", source_,
                           "tensor '" + name + "' has dtype " + entry.dtype + "; readable dtypes are F32, F64, F16, BF16");
    const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + data_offset_ + entry.begin;
    NdArray<T> a;
    a.shape = entry.shape;
    const std::size_t count = (entry.end - entry.begin) / entry.item_size;
    a.values.resize(count);
    for (std::size_t n = 0; n < count; ++n) a.values[n] = detail::decode_stored_float<T>(*stored, p + entry.item_size * n);
    return a;
  }

  /// Tensor `name` as a Tensor<T, Rank>; ShapeError when its rank is not Rank (a 0-d tensor reads as rank 1).
  template <typename T, int Rank>
  Tensor<T, Rank> tensor(const std::string& name) const {
    return to_tensor<Rank>(array<T>(name), "'" + name + "' in " + source_);
  }

 private:
  static constexpr const char* fn_ = "parse_safetensors";
  static constexpr std::size_t max_rank = 64;

  [[noreturn]] void fail(const std::string& message) const { detail::throw_format(fn_, source_, message); }

  void parse() {
    if (bytes_.size() < 8)
      fail("truncated: " + std::to_string(bytes_.size()) + " bytes, shorter than the 8-byte header length");
    const std::uint64_t header_length = detail::load_le(reinterpret_cast<const unsigned char*>(bytes_.data()), 8);
    if (header_length > bytes_.size() - 8)
      fail("the header length is " + std::to_string(header_length) + " bytes but only " +
           std::to_string(bytes_.size() - 8) + " follow it (truncated or not a .safetensors file)");
    data_offset_ = 8 + static_cast<std::size_t>(header_length);
    const std::size_t data_size = bytes_.size() - data_offset_;

    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + static_cast<std::ptrdiff_t>(data_offset_),
                                     nullptr, /*allow_exceptions=*/false);
    } catch (const nlohmann::json::exception& e) {  // not expected with allow_exceptions = false; belt and braces
      fail(std::string("bad JSON header: ") + e.what());
    }
    if (header.is_discarded()) fail("bad JSON header (not valid JSON)");
    if (!header.is_object()) fail("the JSON header is not an object");

    std::vector<std::pair<std::size_t, std::size_t>> spans;  // (begin, end) for the tiling check
    for (const auto& item : header.items()) {
      const std::string& name = item.key();
      const nlohmann::json& value = item.value();
      if (name == "__metadata__") {
        if (!value.is_object()) fail("__metadata__: expected an object of strings");
        for (const auto& m : value.items()) {
          if (!m.value().is_string()) fail("__metadata__: value of '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string what = "tensor '" + name + "'";
      if (!value.is_object()) fail(what + ": expected an object with dtype, shape, data_offsets");
      SafetensorsTensorInfo entry;
      bool have_dtype = false, have_shape = false, have_offsets = false;
      for (const auto& field : value.items()) {
        const std::string& key = field.key();
        const nlohmann::json& v = field.value();
        if (key == "dtype") {
          if (!v.is_string()) fail(what + ": dtype is not a string");
          entry.dtype = v.get<std::string>();
          entry.item_size = detail::safetensors_item_size(entry.dtype);
          if (entry.item_size == 0) fail(what + ": unknown dtype '" + entry.dtype + "'");
          have_dtype = true;
        } else if (key == "shape") {
          if (!v.is_array()) fail(what + ": shape is not an array");
          if (v.size() > max_rank) fail(what + ": shape has more than " + std::to_string(max_rank) + " dimensions");
          for (const nlohmann::json& extent : v) {
            const std::uint64_t e = detail::json_unsigned(fn_, source_, extent, what + " shape");
            if (e > static_cast<std::uint64_t>(std::numeric_limits<Index>::max())) fail(what + ": extent too large");
            entry.shape.push_back(static_cast<Index>(e));
          }
          have_shape = true;
        } else if (key == "data_offsets") {
          if (!v.is_array() || v.size() != 2) fail(what + ": data_offsets is not an array [begin, end]");
          const std::uint64_t begin = detail::json_unsigned(fn_, source_, v[0], what + " data_offsets");
          const std::uint64_t end = detail::json_unsigned(fn_, source_, v[1], what + " data_offsets");
          if (begin > end) fail(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] are reversed");
          if (end > data_size)
            fail(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] run past the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
          entry.begin = static_cast<std::size_t>(begin);
          entry.end = static_cast<std::size_t>(end);
          have_offsets = true;
        } else {
          fail(what + ": unexpected field '" + key + "' (expected dtype, shape, data_offsets)");
        }
      }
      if (!have_dtype) fail(what + ": missing dtype");
      if (!have_shape) fail(what + ": missing shape");
      if (!have_offsets) fail(what + ": missing data_offsets");
      const auto count = static_cast<std::size_t>(detail::checked_element_count(fn_, source_, entry.shape));
      const std::size_t span = entry.end - entry.begin;
      // count * item_size may overflow: compare by division instead.
      if (span % entry.item_size != 0 || span / entry.item_size != count)
        fail(what + ": shape " + detail::dynamic_shape_string(entry.shape) + " of " + entry.dtype + " needs " +
             std::to_string(count) + " x " + std::to_string(entry.item_size) + " bytes, but data_offsets span " +
             std::to_string(span));
      spans.emplace_back(entry.begin, entry.end);
      tensors_.emplace(name, std::move(entry));
    }

    // The tensors must tile the data section exactly: sorted by offsets, each begins where the previous ended.
    std::sort(spans.begin(), spans.end());
    std::size_t next = 0;
    for (const auto& span : spans) {
      if (span.first < next)
        fail("tensor data overlap: [" + std::to_string(span.first) + ", " + std::to_string(span.second) +
             ") starts before byte " + std::to_string(next) + " where the previous tensor ends");
      if (span.first > next)
        fail("hole in the data section: bytes [" + std::to_string(next) + ", " + std::to_string(span.first) +
             ") belong to no tensor");
      next = span.second;
    }
    if (next != data_size)
      fail("the data section has " + std::to_string(data_size) + " bytes but the tensors cover " + std::to_string(next));
  }

  std::string bytes_;                                     // the whole file
  std::string source_;                                    // path or "<memory>", for messages
  std::size_t data_offset_ = 0;                           // 8 + header length
  std::map<std::string, SafetensorsTensorInfo> tensors_;  // validated entries
  std::map<std::string, std::string> metadata_;
};

/// \brief Parses and validates a `.safetensors` file held in memory (the bytes are copied). Throws
/// FormatError for anything malformed; never reads outside [data, data + size).
/// \code
/// SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
/// \endcode
inline SafetensorsFile parse_safetensors(const char* data, std::size_t size, const std::string& source = "<memory>") {
  if (data == nullptr && size > 0) detail::throw_format("parse_safetensors", source, "null data pointer");
  return SafetensorsFile(size == 0 ? std::string() : std::string(data, size), source);
}

/// \brief Reads and validates a `.safetensors` file. FormatError when malformed, std::runtime_error on I/O failure.
/// \code
/// Tensor<float, 2> w = read_safetensors("model.safetensors").tensor<float, 2>("in_proj_weight");
/// \endcode
inline SafetensorsFile read_safetensors(const std::string& path) {
  return SafetensorsFile(detail::read_binary_file("read_safetensors", path), path);
}

/// \brief Builds a `.safetensors` file from float (F32), double (F64), Eigen::half (F16) and Eigen::bfloat16
/// (BF16) tensors, each stored bit for bit in its own dtype.
///
/// Tensors are laid out in name order; the header is padded with spaces to a multiple of 8 bytes, as the
/// reference implementation writes it.
/// \code
/// SafetensorsWriter w;
/// w.add("out_proj.weight", mha.params().out_weight);
/// w.add_metadata("format", "pt");
/// w.write("out.safetensors");
/// \endcode
class SafetensorsWriter {
 public:
  /// Adds a Tensor or TensorView (float, double, Eigen::half or Eigen::bfloat16; any strides) under `name`.
  template <typename X, typename = std::enable_if_t<detail::tensor_traits<std::decay_t<X>>::is_tensor>>
  void add(const std::string& name, const X& tensor) {
    using T = detail::scalar_of<X>;
    constexpr int rank = detail::tensor_traits<std::decay_t<X>>::rank;
    const Tensor<T, rank> dense(detail::const_view(tensor));
    add_values(name, std::vector<Index>(dense.shape().begin(), dense.shape().end()), dense.data(),
               static_cast<std::size_t>(dense.size()));
  }
  /// Adds an NdArray (any rank, including 0-d) under `name`.
  template <typename T>
  void add(const std::string& name, const NdArray<T>& array) {
    if (static_cast<std::size_t>(detail::checked_element_count("SafetensorsWriter::add", name, array.shape)) !=
        array.values.size())
      throw ShapeError("[SafetensorsWriter::add] " + name + ": shape " + detail::dynamic_shape_string(array.shape) +
                       " does not match its " + std::to_string(array.values.size()) + " values");
    add_values(name, array.shape, array.values.data(), array.values.size());
  }
  /// Sets a `__metadata__` string (PyTorch's writer sets "format": "pt").
  void add_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  /// The bytes of the file.
  std::string encode() const {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::size_t offset = 0;
    for (const auto& entry : entries_) {
      const std::size_t end = offset + entry.second.data.size();
      header[entry.first] = {{"dtype", entry.second.dtype}, {"shape", entry.second.shape}, {"data_offsets", {offset, end}}};
      offset = end;
    }
    std::string text;
    try {
      text = header.dump();
    } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not valid UTF-8
      throw std::invalid_argument(std::string("[SafetensorsWriter::encode] ") + e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out;
    detail::store_le(out, text.size(), 8);
    out += text;
    for (const auto& entry : entries_) out += entry.second.data;
    return out;
  }
  /// Writes the file, atomically: a failed write throws std::runtime_error and leaves the old file as it was
  /// (io/atomic_file.hpp).
  void write(const std::string& path) const {
    detail::write_file_atomically("SafetensorsWriter::write", path, encode());
  }

 private:
  struct Entry {
    std::string dtype;
    std::vector<Index> shape;
    std::string data;  // little-endian bytes
  };

  template <typename T>
  void add_values(const std::string& name, const std::vector<Index>& shape, const T* values, std::size_t count) {
    constexpr const char* dtype = detail::safetensors_dtype_of<T>();
    if (name == "__metadata__") throw std::invalid_argument("[SafetensorsWriter::add] '__metadata__' is reserved");
    if (entries_.count(name)) throw std::invalid_argument("[SafetensorsWriter::add] duplicate tensor name '" + name + "'");
    Entry entry{dtype, shape, {}};
    entry.data.reserve(count * sizeof(T));
    for (std::size_t n = 0; n < count; ++n) detail::store_le(entry.data, detail::element_bits(values[n]), sizeof(T));
    entries_.emplace(name, std::move(entry));
  }

  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// \brief The tensors of a `.safetensors` file whose names start with `prefix`, converted to T (float, double,
/// Eigen::half or Eigen::bfloat16, as SafetensorsFile::array converts; only those tensors are decoded, so other
/// tensors of any dtype may share the file). Throws FormatError for a non-float dtype.
/// \code
/// StateDict<float> sd = state_dict_from_safetensors<float>(read_safetensors("model.safetensors"), "attn.");
/// \endcode
template <typename T>
StateDict<T> state_dict_from_safetensors(const SafetensorsFile& file, const std::string& prefix = "") {
  StateDict<T> sd;
  for (const std::string& name : file.names())
    if (detail::has_prefix(name, prefix)) sd[name] = file.array<T>(name);
  return sd;
}

/// \brief read_safetensors then state_dict_from_safetensors.
/// \code
/// MultiHeadAttention<float> mha(cfg);
/// load_state_dict(mha, read_state_dict_safetensors<float>("mha.safetensors"));
/// \endcode
template <typename T>
StateDict<T> read_state_dict_safetensors(const std::string& path, const std::string& prefix = "") {
  return state_dict_from_safetensors<T>(read_safetensors(path), prefix);
}

}  // namespace selfattn

#else
/// 0: `<nlohmann/json.hpp>` is not available, so selfattn/io/safetensors.hpp defines nothing else.
#define SELFATTN_HAS_SAFETENSORS 0
#endif
