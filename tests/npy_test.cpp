// tests/npy_test.cpp — selfattn/io/npy.hpp: files written by NumPy (tests/fixtures/npy, made by make_fixtures.py),
// round trips through our writer, and every malformed case giving FormatError, never a crash.
#include <selfattn/io/npy.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
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
  expect_error<FormatError>([] { read_npy<float, 1>(npy_fixture("f4_big_endian_3.npy")); }, {"'>f4'"});
  expect_error<FormatError>([] { read_npy<float, 1>(npy_fixture("f2_3.npy")); }, {"'<f2'"});
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
