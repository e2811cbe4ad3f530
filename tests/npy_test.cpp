// tests/npy_test.cpp — selfattn/io/npy.hpp: files written by NumPy (tests/fixtures/npy, made by make_fixtures.py),
// round trips through our writer, float16/bfloat16 storage and rounding (checked against an exact reference
// written here), and every malformed case giving FormatError, never a crash.
#include <selfattn/io/npy.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace selfattn;
using selfattn::test::expect_error;

namespace {

std::string npy_fixture(const std::string& name) { return std::string(SELFATTN_FIXTURE_DIR) + "/npy/" + name; }

// The values make_fixtures.py writes: element n (C order) is sign * (0.25 + 0.5 n).
double ramp(Index n, double sign) { return sign * (0.25 + 0.5 * static_cast<double>(n)); }

template <typename T>
void expect_ramp(const T* values, Index count, double sign) {
  for (Index n = 0; n < count; ++n) ASSERT_EQ(values[n], static_cast<T>(ramp(n, sign))) << "element " << n;
}

// A .npy file from its parts, for malformed variants: magic, version, header length field, dict text, data.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const std::size_t length = dict.size() + 1;
  for (std::size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return out + dict + "\n" + data;
}

std::string float_bytes(std::size_t count) { return std::string(count * 4, '\0'); }

// A file of the io fuzz corpus (tests/fuzz/corpus/io), whole: its first byte picks the parser (io_fuzz.cpp).
std::string io_corpus_file(const std::string& name) {
  std::ifstream in(std::string(SELFATTN_FIXTURE_DIR) + "/../fuzz/corpus/io/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void expect_format_error(const std::string& bytes, const std::vector<std::string>& fragments) {
  expect_error<FormatError>([&] { parse_npy_array<float>(bytes.data(), bytes.size()); }, fragments);
}

}  // namespace

// ---- Files written by NumPy ------------------------------------------------------------------------------

TEST(NpyRead, Float32Version1) {
  const Tensor<float, 2> t = read_npy<float, 2>(npy_fixture("f4_2x3_v1.npy"));
  EXPECT_EQ(t.shape(), (std::array<Index, 2>{2, 3}));
  expect_ramp(t.data(), t.size(), 1.0);
  // float32 data read as double converts exactly.
  const Tensor<double, 2> d = read_npy<double, 2>(npy_fixture("f4_2x3_v1.npy"));
  expect_ramp(d.data(), d.size(), 1.0);
}

TEST(NpyRead, Float64Version1) {
  const Tensor<double, 3> t = read_npy<double, 3>(npy_fixture("f8_2x3x4_v1.npy"));
  EXPECT_EQ(t.shape(), (std::array<Index, 3>{2, 3, 4}));
  expect_ramp(t.data(), t.size(), -1.0);
  const Tensor<float, 3> f = read_npy<float, 3>(npy_fixture("f8_2x3x4_v1.npy"));  // rounds to nearest float
  expect_ramp(f.data(), f.size(), -1.0);
}

TEST(NpyRead, Versions2And3) {
  const std::string v2 = detail::read_binary_file("test", npy_fixture("f4_5_v2.npy"));
  const NpyHeader h2 = parse_npy_header(v2.data(), v2.size());
  EXPECT_EQ(h2.major_version, 2);
  EXPECT_EQ(h2.data_offset % 64, 0u);  // NumPy aligns the data
  const Tensor<float, 1> a = parse_npy<float, 1>(v2.data(), v2.size());
  EXPECT_EQ(a.dim(0), 5);
  expect_ramp(a.data(), a.size(), 1.0);

  const std::string v3 = detail::read_binary_file("test", npy_fixture("f8_3x2_v3.npy"));
  EXPECT_EQ(parse_npy_header(v3.data(), v3.size()).major_version, 3);
  const Tensor<double, 2> b = read_npy<double, 2>(npy_fixture("f8_3x2_v3.npy"));
  EXPECT_EQ(b.shape(), (std::array<Index, 2>{3, 2}));
  expect_ramp(b.data(), b.size(), -1.0);
}

TEST(NpyRead, ZeroDimensionalIsOneValue) {
  const NdArray<double> a = read_npy_array<double>(npy_fixture("f8_scalar.npy"));
  EXPECT_TRUE(a.shape.empty());
  ASSERT_EQ(a.values.size(), 1u);
  EXPECT_EQ(a.values[0], ramp(0, -1.0));
  const Tensor<double, 1> t = read_npy<double, 1>(npy_fixture("f8_scalar.npy"));  // documented: rank 0 -> (1)
  EXPECT_EQ(t.dim(0), 1);
  EXPECT_EQ(t(0), ramp(0, -1.0));
  expect_error<ShapeError>([] { read_npy<double, 2>(npy_fixture("f8_scalar.npy")); }, {"expected rank 2", "()"});
}

TEST(NpyRead, EmptyShape) {
  const Tensor<float, 2> t = read_npy<float, 2>(npy_fixture("f4_0x3.npy"));
  EXPECT_EQ(t.shape(), (std::array<Index, 2>{0, 3}));
  EXPECT_EQ(t.size(), 0);
}

TEST(NpyRead, FortranOrderIsTransposedToCOrder) {
  const std::string bytes = detail::read_binary_file("test", npy_fixture("f8_3x4_fortran.npy"));
  EXPECT_TRUE(parse_npy_header(bytes.data(), bytes.size()).fortran_order);
  const Tensor<double, 2> t = parse_npy<double, 2>(bytes.data(), bytes.size());
  EXPECT_EQ(t.shape(), (std::array<Index, 2>{3, 4}));
  expect_ramp(t.data(), t.size(), -1.0);
  const Tensor<float, 3> u = read_npy<float, 3>(npy_fixture("f4_2x3x2_fortran.npy"));
  EXPECT_EQ(u.shape(), (std::array<Index, 3>{2, 3, 2}));
  expect_ramp(u.data(), u.size(), 1.0);
}

TEST(NpyRead, UnsupportedDtypesAreNamed) {
  expect_error<FormatError>([] { read_npy<float, 1>(npy_fixture("i4_3.npy")); }, {"i4_3.npy", "unsupported dtype '<i4'"});
  expect_error<FormatError>([] { read_npy<float, 1>(npy_fixture("f4_big_endian_3.npy")); },
                            {"'>f4'", "expected '<f2', '<f4' or '<f8'"});
}

TEST(NpyRead, WrongRankNamesFileAndShape) {
  expect_error<ShapeError>([] { read_npy<float, 3>(npy_fixture("f4_2x3_v1.npy")); },
                           {"f4_2x3_v1.npy", "expected rank 3", "(2, 3)"});
}

TEST(NpyRead, MissingFileIsAnIoError) {
  EXPECT_THROW((read_npy<float, 1>(npy_fixture("does_not_exist.npy"))), std::runtime_error);
}

// ---- Round trips through our writer ----------------------------------------------------------------------

TEST(NpyWrite, RoundTripFloatAndDoubleBitExact) {
  test::Random random(11);
  Tensor<float, 3> f = random.normal_tensor<float, 3>({2, 5, 7});
  f(0, 0, 0) = std::numeric_limits<float>::infinity();
  f(1, 4, 6) = std::numeric_limits<float>::quiet_NaN();
  f(0, 1, 2) = -0.0f;
  f(1, 0, 3) = std::numeric_limits<float>::denorm_min();
  const std::string bytes = encode_npy(f);
  const NpyHeader h = parse_npy_header(bytes.data(), bytes.size());
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_FALSE(h.fortran_order);
  EXPECT_EQ(h.data_offset % 64, 0u);
  const Tensor<float, 3> back = parse_npy<float, 3>(bytes.data(), bytes.size());
  ASSERT_EQ(back.shape(), f.shape());
  EXPECT_EQ(std::memcmp(back.data(), f.data(), sizeof(float) * static_cast<std::size_t>(f.size())), 0);

  const Tensor<double, 1> d = random.normal_tensor<double, 1>({13});
  const std::string dbytes = encode_npy(d);
  EXPECT_EQ(parse_npy_header(dbytes.data(), dbytes.size()).descr, "<f8");
  const Tensor<double, 1> dback = parse_npy<double, 1>(dbytes.data(), dbytes.size());
  EXPECT_EQ(std::memcmp(dback.data(), d.data(), sizeof(double) * 13), 0);
}

TEST(NpyWrite, StridedViewIsWrittenInLogicalOrder) {
  test::Random random(12);
  Tensor<double, 3> t = random.normal_tensor<double, 3>({3, 4, 5});
  const TensorView<const double, 3> permuted = TensorView<const double, 3>(t).permute({1, 0, 2});  // (4, 3, 5)
  const std::string bytes = encode_npy(permuted);
  const Tensor<double, 3> back = parse_npy<double, 3>(bytes.data(), bytes.size());
  ASSERT_EQ(back.shape(), (std::array<Index, 3>{4, 3, 5}));
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j)
      for (Index k = 0; k < 5; ++k) ASSERT_EQ(back(i, j, k), t(j, i, k));
}

TEST(NpyWrite, EmptyAndFileRoundTrip) {
  const Tensor<float, 2> empty({0, 4});
  const std::string bytes = encode_npy(empty);
  EXPECT_EQ((parse_npy<float, 2>(bytes.data(), bytes.size()).shape()), (std::array<Index, 2>{0, 4}));

  test::Random random(13);
  const Tensor<float, 2> t = random.normal_tensor<float, 2>({6, 3});
  const std::string path = ::testing::TempDir() + "selfattn_npy_roundtrip.npy";
  write_npy(path, t);
  const Tensor<float, 2> back = read_npy<float, 2>(path);
  std::filesystem::remove(path);
  EXPECT_EQ(std::memcmp(back.data(), t.data(), sizeof(float) * 18), 0);
}

TEST(NpyWrite, HeaderMatchesNumpysSpelling) {
  // NumPy's reader accepts only a dict literal; one-dimensional shapes need the trailing comma.
  const Tensor<float, 1> v({3});
  const std::string bytes = encode_npy(v);
  EXPECT_NE(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"), std::string::npos);
  const Tensor<double, 2> m({2, 3});
  EXPECT_NE(encode_npy(m).find("'shape': (2, 3), }"), std::string::npos);
}

// ---- Malformed input: FormatError, never a crash --------------------------------------------------------

TEST(NpyMalformed, EveryTruncationIsAnError) {
  test::Random random(14);
  const std::string bytes = encode_npy(random.normal_tensor<float, 2>({3, 5}));
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    const std::string cut = bytes.substr(0, size);
    EXPECT_THROW(parse_npy_array<float>(cut.data(), cut.size()), FormatError) << "prefix of " << size << " bytes";
  }
  expect_format_error(bytes.substr(0, bytes.size() - 1), {"truncated data", "(3, 5)", "59 follow the header"});
  expect_format_error(bytes.substr(0, 9), {"truncated"});
}

TEST(NpyMalformed, PreambleAndLengths) {
  const std::string good = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", float_bytes(2));
  ASSERT_NO_THROW(parse_npy_array<float>(good.data(), good.size()));
  std::string bad = good;
  bad[1] = 'X';
  expect_format_error(bad, {"not a .npy file"});
  bad = good;
  bad[6] = 4;
  expect_format_error(bad, {"unsupported format version 4.0"});
  bad = good;
  bad[7] = 1;
  expect_format_error(bad, {"version 1.1"});
  bad = good;
  bad[8] = '\xff';
  bad[9] = '\xff';
  expect_format_error(bad, {"header length is 65535", "truncated"});
  expect_format_error(good + "xyz", {"3 unexpected bytes after the data"});
  // A 4-byte length field of 0xffffffff in version 2.0.
  std::string v2 = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", float_bytes(2), 2);
  ASSERT_NO_THROW(parse_npy_array<float>(v2.data(), v2.size()));
  for (int i = 8; i < 12; ++i) v2[static_cast<std::size_t>(i)] = '\xff';
  expect_format_error(v2, {"header length is 4294967295"});
}

TEST(NpyMalformed, HeaderDict) {
  const std::string data = float_bytes(2);
  const auto check = [&](const std::string& dict, const std::vector<std::string>& fragments) {
    SCOPED_TRACE(dict);
    expect_format_error(make_npy(dict, data), fragments);
  };
  check("{'descr': '<f4', 'fortran_order': False}", {"missing key 'shape'"});
  check("{'descr': '<f4', 'shape': (2,)}", {"missing key 'fortran_order'"});
  check("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", {"duplicate key 'descr'"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", {"unexpected key 'extra'"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", {"not a tuple"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", {"non-negative"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (02,)}", {"leading zero"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", {"extent too large"});
  check("{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", {"True or False"});
  check("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", {"True or False"});
  check("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", {"structured dtypes are not supported"});
  check("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", {"after the value of 'descr'"});
  check("{'descr': '<f\\4', 'fortran_order': False, 'shape': (2,)}", {"escape"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", {"unexpected text after"});
  check("{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", {"',' or '}'"});
  check("['descr', '<f4']", {"expected '{'"});
  check("", {"expected '{'"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", {"expected a non-negative integer"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", {"expected ',' or ')'"});
  // Shapes whose element count overflows, with or without a zero extent (strides would overflow too).
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", {"overflows"});
  check("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296)}", {"overflows"});
  // A huge but representable count must fail on the data length, not allocate.
  check("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,)}", {"truncated data"});
  // Python accepts double quotes, a trailing comma, any key order: so do we.
  const std::string ok = make_npy("{\"shape\": (1, 2,), \"fortran_order\": True, \"descr\": \"<f4\"}", data);
  EXPECT_EQ(parse_npy_array<float>(ok.data(), ok.size()).shape, (std::vector<Index>{1, 2}));
}

// 2^61 + 1 elements of '<f8' are 2^64 + 8 bytes, which wraps to 8 in std::size_t. A size check that multiplies
// (count * item_size > available) would see the 8 data bytes present, pass, and leave resize() to throw
// std::length_error (or std::bad_alloc) instead of a FormatError; the reader divides instead.
TEST(NpyMalformed, ElementCountWhoseByteSizeWrapsIsTruncatedData) {
  static_assert(std::uint64_t{2305843009213693953u} * 8u == 8u, "the byte size wraps to the data present");
  const std::string bytes = make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693953,), }",
                                     std::string("\0\0\0\0\0\0\xf0\x3f", 8));
  const std::vector<std::string> fragments{"truncated data", "shape (2305843009213693953,) of <f8",
                                           "needs 2305843009213693953 x 8 bytes, but only 8 follow the header"};
  expect_error<FormatError>([&] { parse_npy_header(bytes.data(), bytes.size()); }, fragments);
  expect_error<FormatError>([&] { parse_npy_array<double>(bytes.data(), bytes.size()); }, fragments);
  expect_error<FormatError>([&] { parse_npy_array<float>(bytes.data(), bytes.size()); }, fragments);
  expect_error<FormatError>([&] { parse_npy_array<Eigen::half>(bytes.data(), bytes.size()); }, fragments);
  expect_error<FormatError>([&] { parse_npy_array<Eigen::bfloat16>(bytes.data(), bytes.size()); }, fragments);
  // The io fuzz corpus holds this file for each npy choice (first byte 1: double; 0: float, half, bfloat16), so the
  // replay, whose oracle takes any exception but std::invalid_argument for a finding, runs it too.
  EXPECT_TRUE(io_corpus_file("npy-d-f8_count_wraps") == '\x01' + bytes) << "tests/fuzz/corpus/io/npy-d-f8_count_wraps";
  EXPECT_TRUE(io_corpus_file("npy-f-f8_count_wraps") == '\x00' + bytes) << "tests/fuzz/corpus/io/npy-f-f8_count_wraps";
}

TEST(NpyMalformed, CorruptedBytesNeverCrash) {
  // Every byte of the preamble and header replaced by several values: either a valid file or FormatError.
  test::Random random(15);
  const std::string good = encode_npy(random.normal_tensor<double, 2>({2, 3}));
  const std::size_t data_offset = parse_npy_header(good.data(), good.size()).data_offset;
  int errors = 0, parsed = 0;
  for (std::size_t at = 0; at < data_offset; ++at)
    for (const char value : {'\0', '\xff', '(', ')', ',', '\'', '9', ' ', '}'}) {
      std::string bytes = good;
      bytes[at] = value;
      try {
        parse_npy_array<double>(bytes.data(), bytes.size());
        ++parsed;
      } catch (const FormatError&) {
        ++errors;
      }
    }
  EXPECT_GT(errors, 0);
  EXPECT_GT(parsed, 0);  // e.g. a space replaced by a space
}

TEST(NpyToTensor, CheckedAgainstValues) {
  NdArray<float> a{{2, 2}, {1.0f, 2.0f, 3.0f}};  // inconsistent: 3 values for 4 elements
  expect_error<ShapeError>([&] { to_tensor<2>(a, "a"); }, {"a", "(2, 2)", "3 values"});
}

// ---- float16 and bfloat16 --------------------------------------------------------------------------------

namespace {

std::uint16_t bits_of(Eigen::half h) { return detail::element_bits(h); }
std::uint16_t bits_of(Eigen::bfloat16 b) { return detail::element_bits(b); }
Eigen::half half_bits(std::uint16_t bits) { return detail::element_from_bits<Eigen::half>(bits); }
float float_bits(std::uint32_t bits) { return detail::element_from_bits<float>(bits); }
double double_bits(std::uint64_t bits) { return detail::element_from_bits<double>(bits); }

// Every 16-bit pattern once, as a tensor of T: NaNs with all payloads, both infinities, both zeros, subnormals.
template <typename T>
Tensor<T, 1> every_bit_pattern() {
  Tensor<T, 1> t({65536});
  for (Index n = 0; n < 65536; ++n) t(n) = detail::element_from_bits<T>(static_cast<std::uint16_t>(n));
  return t;
}

// The 16-bit formats as plain numbers, independent of the library and of Eigen: exponent bits and bias,
// significand bits. A positive finite pattern p has the value (2^m + mantissa) 2^(e - bias - m) for e > 0 and
// mantissa 2^(1 - bias - m) for e = 0.
struct Format16 {
  int mantissa_bits;
  int bias;
  std::uint16_t infinity;  // the first pattern past the largest finite value: exponent all ones
};
constexpr Format16 float16_format{10, 15, 0x7c00};
constexpr Format16 bfloat16_format{7, 127, 0x7f80};

// The value of a non-negative pattern p <= infinity; the infinity pattern stands for 2^(emax + 1), the value
// it would have with an unbounded exponent, which is what rounding to nearest compares against (IEEE 754
// 7.4: overflow when the rounded value would reach it).
double format16_value(const Format16& f, std::uint16_t p) {
  const int exponent = p >> f.mantissa_bits;
  const int mantissa = p & ((1 << f.mantissa_bits) - 1);
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.mantissa_bits);
  return std::ldexp(static_cast<double>((1 << f.mantissa_bits) + mantissa), exponent - f.bias - f.mantissa_bits);
}

// Rounds x (not NaN) to the format by search: the two patterns around |x|, the nearer, the even one on a tie.
// Both neighbours are within a factor 2 of |x| (or 0), so the differences below are exact in double.
std::uint16_t reference_round(const Format16& f, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(x);
  if (magnitude >= format16_value(f, f.infinity)) return sign | f.infinity;
  std::uint16_t low = 0, high = f.infinity;  // value(low) <= magnitude < value(high)
  while (high - low > 1) {
    const auto middle = static_cast<std::uint16_t>((low + high) / 2);
    (format16_value(f, middle) <= magnitude ? low : high) = middle;
  }
  const double below = magnitude - format16_value(f, low), above = format16_value(f, high) - magnitude;
  const std::uint16_t nearer = below < above ? low : above < below ? high : (low % 2 == 0 ? low : high);
  return sign | nearer;
}

// Values read through a .npy file of Source values into T.
template <typename T, typename Source>
std::vector<T> read_as(const std::vector<Source>& values) {
  Tensor<Source, 1> t({static_cast<Index>(values.size())});
  std::copy(values.begin(), values.end(), t.data());
  const std::string bytes = encode_npy(t);
  return parse_npy_array<T>(bytes.data(), bytes.size()).values;
}

}  // namespace

TEST(NpyHalf, NumpyFloat16FileReadsIntoEveryType) {
  // make_fixtures.py wrote the ramp 0.25, 0.75, 1.25 as '<f2' with NumPy; all three are exact in both formats.
  const std::string bytes = detail::read_binary_file("test", npy_fixture("f2_3.npy"));
  const NpyHeader h = parse_npy_header(bytes.data(), bytes.size());
  EXPECT_EQ(h.descr, "<f2");
  EXPECT_EQ(h.item_size, 2u);
  const Tensor<Eigen::half, 1> half = parse_npy<Eigen::half, 1>(bytes.data(), bytes.size());
  ASSERT_EQ(half.dim(0), 3);
  EXPECT_EQ(bits_of(half(0)), 0x3400);  // 2^-2
  EXPECT_EQ(bits_of(half(1)), 0x3a00);  // 1.5 * 2^-1
  EXPECT_EQ(bits_of(half(2)), 0x3d00);  // 1.25
  expect_ramp(read_npy<float, 1>(npy_fixture("f2_3.npy")).data(), 3, 1.0);
  expect_ramp(read_npy<double, 1>(npy_fixture("f2_3.npy")).data(), 3, 1.0);
  const NdArray<Eigen::bfloat16> b = read_npy_array<Eigen::bfloat16>(npy_fixture("f2_3.npy"));
  EXPECT_EQ(bits_of(b.values[0]), 0x3e80);
  EXPECT_EQ(bits_of(b.values[1]), 0x3f40);
  EXPECT_EQ(bits_of(b.values[2]), 0x3fa0);
}

TEST(NpyHalf, EveryPatternRoundTripsBitExact) {
  const Tensor<Eigen::half, 1> all = every_bit_pattern<Eigen::half>();
  const std::string bytes = encode_npy(all);
  const NpyHeader h = parse_npy_header(bytes.data(), bytes.size());
  EXPECT_EQ(h.descr, "<f2");
  EXPECT_EQ(bytes.size(), h.data_offset + 2 * 65536);
  EXPECT_NE(bytes.find("{'descr': '<f2', 'fortran_order': False, 'shape': (65536,), }"), std::string::npos);
  // NaNs included: a half read as half is never converted, so every payload survives.
  const Tensor<Eigen::half, 1> back = parse_npy<Eigen::half, 1>(bytes.data(), bytes.size());
  EXPECT_EQ(std::memcmp(back.data(), all.data(), 2 * 65536), 0);
  // Into float and double: exact, compared with Eigen's own float16 -> float (a second implementation).
  const Tensor<float, 1> as_float = parse_npy<float, 1>(bytes.data(), bytes.size());
  const Tensor<double, 1> as_double = parse_npy<double, 1>(bytes.data(), bytes.size());
  for (Index n = 0; n < 65536; ++n) {
    const float expected = static_cast<float>(all(n));
    SCOPED_TRACE(n);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(as_float(n)) && std::isnan(as_double(n)));
      ASSERT_EQ(std::signbit(as_float(n)), std::signbit(expected));
    } else {
      ASSERT_EQ(detail::element_bits(as_float(n)), detail::element_bits(expected));  // -0 stays -0
      ASSERT_EQ(detail::element_bits(as_double(n)), detail::element_bits(static_cast<double>(expected)));
    }
  }
}

TEST(NpyHalf, FortranOrderFloat16IsTransposed) {
  // (2, 3) in Fortran order: the bytes hold column after column.
  const std::uint16_t column_major[] = {0x3c00, 0x4400, 0x4000, 0x4500, 0x4200, 0x4600};  // 1 4 2 5 3 6
  std::string data;
  for (std::uint16_t v : column_major) detail::store_le(data, v, 2);
  const std::string dict = "{'descr': '<f2', 'fortran_order': True, 'shape': (2, 3), }";
  const std::string bytes = make_npy(dict, data);
  const Tensor<Eigen::half, 2> t = parse_npy<Eigen::half, 2>(bytes.data(), bytes.size());
  const std::uint16_t row_major[] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};  // 1 2 3 4 5 6
  for (Index n = 0; n < 6; ++n) EXPECT_EQ(bits_of(t.data()[n]), row_major[n]) << n;
  EXPECT_EQ((parse_npy<float, 2>(bytes.data(), bytes.size())(1, 2)), 6.0f);
}

TEST(NpyHalf, Float16ErrorsNameTheDtype) {
  const std::string data(6, '\0');
  expect_format_error(make_npy("{'descr': '>f2', 'fortran_order': False, 'shape': (3,), }", data),
                      {"unsupported dtype '>f2'", "'<f2', '<f4' or '<f8'"});
  expect_format_error(make_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", data),
                      {"shape (4,) of <f2 needs 4 x 2 bytes", "only 6 follow"});
}

TEST(NpyBfloat16, WrittenAsFloat32ExactlyAndReadBackBitExact) {
  // NumPy has no bfloat16: the writer widens to '<f4', which is exact (the bfloat16 bits are the top half).
  const Tensor<Eigen::bfloat16, 1> all = every_bit_pattern<Eigen::bfloat16>();
  const std::string bytes = encode_npy(all);
  const NpyHeader h = parse_npy_header(bytes.data(), bytes.size());
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_EQ(bytes.size(), h.data_offset + 4 * 65536);
  const Tensor<float, 1> as_float = parse_npy<float, 1>(bytes.data(), bytes.size());
  const Tensor<Eigen::bfloat16, 1> back = parse_npy<Eigen::bfloat16, 1>(bytes.data(), bytes.size());
  int nans = 0;
  for (Index n = 0; n < 65536; ++n) {
    SCOPED_TRACE(n);
    const auto pattern = static_cast<std::uint16_t>(n);
    const bool nan = (pattern & 0x7f80) == 0x7f80 && (pattern & 0x7f) != 0;
    if (nan) {  // NaN stays NaN of the same sign; the payload is not promised through the float conversion
      ++nans;
      ASSERT_TRUE(std::isnan(as_float(n)));
      ASSERT_TRUE(Eigen::numext::isnan(back(n)));
      ASSERT_EQ(bits_of(back(n)) & 0x8000, pattern & 0x8000);
    } else {
      ASSERT_EQ(detail::element_bits(as_float(n)), static_cast<std::uint32_t>(pattern) << 16);
      ASSERT_EQ(bits_of(back(n)), pattern);  // subnormals, infinities and -0 included
    }
  }
  EXPECT_EQ(nans, 2 * 127);
  // A file round trip through write_npy / read_npy.
  const std::string path = ::testing::TempDir() + "selfattn_npy_bfloat16.npy";
  write_npy(path, TensorView<const Eigen::bfloat16, 1>(all));
  const Tensor<Eigen::bfloat16, 1> from_file = read_npy<Eigen::bfloat16, 1>(path);
  std::filesystem::remove(path);
  EXPECT_EQ(bits_of(from_file(0x3f80)), 0x3f80);
  EXPECT_EQ(bits_of(from_file(0x8001)), 0x8001);
}

TEST(NpyHalfRounding, TiesGoToEven) {
  // float32 -> float16: 1 + 2^-11 lies halfway between 1 (0x3c00, even) and 1 + 2^-10 (0x3c01).
  const std::vector<float> to_half = {
      float_bits(0x3f801000),  // 1 + 2^-11: tie -> 0x3c00
      float_bits(0x3f803000),  // 1 + 3 * 2^-11: tie between 0x3c01 and 0x3c02 -> 0x3c02
      float_bits(0x3f801001),  // just above the first tie -> 0x3c01
      float_bits(0x3f800fff),  // just below it -> 0x3c00
      65520.0f,                // tie between 65504 (0x7bff, odd) and 2^16 -> +inf
      std::nextafter(65520.0f, 0.0f),  // -> 65504
      -std::ldexp(1.0f, -25),          // half the smallest subnormal: tie -> -0
      std::ldexp(3.0f, -25),           // 1.5 subnormal steps: tie between 0x0001 and 0x0002 -> 0x0002
      std::ldexp(1.0f, -26),           // below half a step -> +0
      -1e30f,                          // overflow -> -inf
  };
  const std::vector<std::uint16_t> expected_half = {0x3c00, 0x3c02, 0x3c01, 0x3c00, 0x7c00,
                                                    0x7bff, 0x8000, 0x0002, 0x0000, 0xfc00};
  const std::vector<Eigen::half> half = read_as<Eigen::half>(to_half);
  for (std::size_t i = 0; i < half.size(); ++i) EXPECT_EQ(bits_of(half[i]), expected_half[i]) << i;

  // float32 -> bfloat16: the low 16 bits 0x8000 are exactly half a bfloat16 step.
  const std::vector<float> to_bfloat16 = {
      float_bits(0x3f808000),  // tie between 0x3f80 (even) and 0x3f81 -> 0x3f80
      float_bits(0x3f818000),  // tie between 0x3f81 and 0x3f82 -> 0x3f82
      float_bits(0x3f808001),  // above -> 0x3f81
      float_bits(0x7f7f8000),  // tie between the largest finite 0x7f7f (odd) and 2^128 -> +inf
      float_bits(0x7f7f7fff),  // below it -> 0x7f7f
      float_bits(0x80008000),  // subnormal tie between -0 and -0x0001 -> -0 (0x8000)
      float_bits(0x00018000),  // subnormal tie between 0x0001 and 0x0002 -> 0x0002
  };
  const std::vector<std::uint16_t> expected_bfloat16 = {0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x7f7f, 0x8000, 0x0002};
  const std::vector<Eigen::bfloat16> bfloat16 = read_as<Eigen::bfloat16>(to_bfloat16);
  for (std::size_t i = 0; i < bfloat16.size(); ++i) EXPECT_EQ(bits_of(bfloat16[i]), expected_bfloat16[i]) << i;

  // float16 -> bfloat16 (11 significant bits to 8): 1 + 2^-8 is a tie -> 1; 1 + 3 * 2^-8 -> 1 + 2^-6.
  const std::vector<Eigen::bfloat16> from_half =
      read_as<Eigen::bfloat16>(std::vector<Eigen::half>{half_bits(0x3c04), half_bits(0x3c0c), half_bits(0x3c05)});
  EXPECT_EQ(bits_of(from_half[0]), 0x3f80);
  EXPECT_EQ(bits_of(from_half[1]), 0x3f82);
  EXPECT_EQ(bits_of(from_half[2]), 0x3f81);  // just above the tie
}

TEST(NpyHalfRounding, Float64IsRoundedOnceNotTwice) {
  // 1 + 2^-11 + 2^-40 is just above the float16 tie between 1 and 1 + 2^-10, so it rounds up. Rounding to
  // float first loses the 2^-40 and leaves an exact tie, which goes down to 1: PyTorch 1.13's
  // torch.tensor(x, dtype=torch.float64).half() gives 1.0, NumPy's astype(np.float16) 1.0009765625.
  const std::vector<double> values = {
      1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),  // float16 -> 0x3c01 (double rounding: 0x3c00)
      1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40),   // bfloat16 -> 0x3f81 (double rounding: 0x3f80); float16 0x3c04
      -(1 + std::ldexp(1.0, -11) - std::ldexp(1.0, -40)),  // just below the tie -> -1 in both
      1e39,    // beyond float's range: +inf in both
      1e-50,   // below both formats' smallest subnormal: +0
      -1e-50,  // -0
      -0.0,
      std::numeric_limits<double>::infinity(),
  };
  const std::vector<std::uint16_t> expected_half = {0x3c01, 0x3c04, 0xbc00, 0x7c00, 0x0000, 0x8000, 0x8000, 0x7c00};
  const std::vector<std::uint16_t> expected_bfloat16 = {0x3f80, 0x3f81, 0xbf80, 0x7f80, 0x0000, 0x8000, 0x8000, 0x7f80};
  const std::vector<Eigen::half> half = read_as<Eigen::half>(values);
  const std::vector<Eigen::bfloat16> bfloat16 = read_as<Eigen::bfloat16>(values);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(bits_of(half[i]), expected_half[i]) << i;
    EXPECT_EQ(bits_of(bfloat16[i]), expected_bfloat16[i]) << i;
  }
  const std::vector<double> nan = {std::numeric_limits<double>::quiet_NaN(), -std::numeric_limits<double>::quiet_NaN()};
  const std::vector<Eigen::half> half_nan = read_as<Eigen::half>(nan);
  const std::vector<Eigen::bfloat16> bfloat16_nan = read_as<Eigen::bfloat16>(nan);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(Eigen::numext::isnan(half_nan[i]) && Eigen::numext::isnan(bfloat16_nan[i]));
    EXPECT_EQ(bits_of(half_nan[i]) >> 15, i);
    EXPECT_EQ(bits_of(bfloat16_nan[i]) >> 15, i);
  }
}

TEST(NpyHalfRounding, MatchesAnExactReference) {
  // Random float32 and float64 values, and values at and next to the ties of both 16-bit formats (where
  // double rounding would show), read into Eigen::half and Eigen::bfloat16 and compared with
  // reference_round. Also every float16 pattern read as bfloat16.
  std::mt19937_64 random(31);  // mt19937_64's sequence is fixed by the standard
  std::vector<float> floats;
  std::vector<double> doubles;
  for (int i = 0; i < 100000; ++i) {
    const auto bits = static_cast<std::uint32_t>(random());
    if ((bits & 0x7f800000u) != 0x7f800000u) floats.push_back(float_bits(bits));  // not inf or NaN
    doubles.push_back(double_bits(random()));
    // A random sign and significand with a binary exponent in [-30, 20): float16's range and around it.
    const std::uint64_t exponent = 1023 - 30 + random() % 50;
    const std::uint64_t in_range = (random() & 0x800fffffffffffffull) | (exponent << 52);
    doubles.push_back(double_bits(in_range));
    floats.push_back(static_cast<float>(double_bits(in_range)));
  }
  for (const Format16& f : {float16_format, bfloat16_format}) {
    for (std::uint16_t p = 0; p < f.infinity; p = static_cast<std::uint16_t>(p + 1 + random() % 7)) {
      const double low = format16_value(f, p), high = format16_value(f, static_cast<std::uint16_t>(p + 1));
      const double tie = low + (high - low) / 2;  // exact in double
      for (double x : {tie, std::nextafter(tie, 0.0), std::nextafter(tie, 1e300), -tie,
                       tie + (high - low) * 0x1p-40, tie - (high - low) * 0x1p-40}) {
        doubles.push_back(x);
        floats.push_back(static_cast<float>(x));
      }
    }
  }
  doubles.erase(std::remove_if(doubles.begin(), doubles.end(), [](double x) { return std::isnan(x); }), doubles.end());
  const auto check = [](const auto& source, const auto& read, const Format16& f, const char* what) {
    int mismatches = 0;
    for (std::size_t i = 0; i < source.size(); ++i) {
      const std::uint16_t expected = reference_round(f, static_cast<double>(source[i]));
      if (bits_of(read[i]) != expected && ++mismatches <= 5)
        ADD_FAILURE() << what << ": " << std::hexfloat << static_cast<double>(source[i]) << " gave " << std::hex
                      << bits_of(read[i]) << ", expected " << expected;
    }
    EXPECT_EQ(mismatches, 0) << what << " of " << source.size();
  };
  check(floats, read_as<Eigen::half>(floats), float16_format, "float32 -> float16");
  check(floats, read_as<Eigen::bfloat16>(floats), bfloat16_format, "float32 -> bfloat16");
  check(doubles, read_as<Eigen::half>(doubles), float16_format, "float64 -> float16");
  check(doubles, read_as<Eigen::bfloat16>(doubles), bfloat16_format, "float64 -> bfloat16");
  std::vector<float> half_values;  // every finite float16 value, exactly
  for (std::uint32_t p = 0; p < 65536; ++p)
    if ((p & 0x7c00) != 0x7c00) half_values.push_back(static_cast<float>(half_bits(static_cast<std::uint16_t>(p))));
  std::vector<Eigen::half> halves;
  for (float v : half_values) halves.push_back(Eigen::half(v));
  check(half_values, read_as<Eigen::bfloat16>(halves), bfloat16_format, "float16 -> bfloat16");
}
