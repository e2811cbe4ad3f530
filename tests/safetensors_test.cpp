// tests/safetensors_test.cpp — selfattn/io/safetensors.hpp: the file PyTorch's side wrote
// (examples/from_pytorch/data, by save_mha.py), round trips through SafetensorsWriter, F16/BF16 conversion
// to and from float and Eigen::half / Eigen::bfloat16 (against tests/fixtures/half, made by
// tests/pytorch/make_half_fixtures.py), and every malformed case giving FormatError, never a crash. Skipped
// without nlohmann/json.
#include <selfattn/io/safetensors.hpp>

#include <gtest/gtest.h>

#if SELFATTN_HAS_SAFETENSORS

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

using namespace selfattn;
using selfattn::test::expect_error;

namespace {

std::string from_pytorch_data(const std::string& name) {
  return std::string(SELFATTN_FIXTURE_DIR) + "/../../examples/from_pytorch/data/" + name;
}

// A .safetensors file from a header text and a data section, for malformed variants.
std::string make_file(const std::string& header, const std::string& data, std::uint64_t length_field) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length_field >> (8 * i)) & 0xff));
  return out + header + data;
}
std::string make_file(const std::string& header, const std::string& data) { return make_file(header, data, header.size()); }

void expect_format_error(const std::string& bytes, const std::vector<std::string>& fragments) {
  expect_error<FormatError>([&] { parse_safetensors(bytes.data(), bytes.size()); }, fragments);
}

std::string le16(std::initializer_list<std::uint16_t> values) {
  std::string out;
  for (std::uint16_t v : values) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
  }
  return out;
}

}  // namespace

// ---- The file written by save_mha.py (PyTorch's state dict) -----------------------------------------------

TEST(SafetensorsRead, PyTorchStateDictMatchesNpyExport) {
  const SafetensorsFile f = read_safetensors(from_pytorch_data("mha.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.info("in_proj_weight").dtype, "F32");
  EXPECT_EQ(f.info("in_proj_weight").shape, (std::vector<Index>{96, 32}));
  // The same tensors went through np.save into mha_npy/: two writers, two readers, the same values.
  for (const std::string& name : f.names()) {
    SCOPED_TRACE(name);
    const NdArray<float> from_safetensors = f.array<float>(name);
    const NdArray<float> from_npy = read_npy_array<float>(from_pytorch_data("mha_npy/" + name + ".npy"));
    EXPECT_EQ(from_safetensors.shape, from_npy.shape);
    EXPECT_EQ(from_safetensors.values, from_npy.values);
  }
  const Tensor<double, 2> w = f.tensor<double, 2>("out_proj.weight");
  EXPECT_EQ(w.shape(), (std::array<Index, 2>{32, 32}));
  expect_error<ShapeError>([&] { f.tensor<float, 1>("out_proj.weight"); }, {"out_proj.weight", "expected rank 1", "(32, 32)"});
  expect_error<std::invalid_argument>([&] { f.array<float>("in_proj"); }, {"no tensor named 'in_proj'"});
}

TEST(SafetensorsRead, MissingFileIsAnIoError) {
  EXPECT_THROW(read_safetensors(from_pytorch_data("nope.safetensors")), std::runtime_error);
}

// ---- Round trips and conversions ---------------------------------------------------------------------------

TEST(SafetensorsWrite, RoundTrip) {
  test::Random random(21);
  Tensor<float, 3> a = random.normal_tensor<float, 3>({2, 3, 4});
  a(1, 2, 3) = std::numeric_limits<float>::quiet_NaN();
  const Tensor<double, 2> b = random.normal_tensor<double, 2>({5, 2});
  const Tensor<float, 2> empty({0, 3});
  SafetensorsWriter w;
  w.add("layer.a", a);
  w.add("b", TensorView<const double, 2>(b).permute({0, 1}));
  w.add("empty", empty);
  w.add("scalar", NdArray<double>{{}, {2.5}});
  w.add_metadata("format", "pt");
  const std::string bytes = w.encode();
  const std::uint64_t header = detail::load_le(reinterpret_cast<const unsigned char*>(bytes.data()), 8);
  EXPECT_EQ(header % 8, 0u);  // padded like the reference writer

  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"b", "empty", "layer.a", "scalar"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const Tensor<float, 3> a_back = f.tensor<float, 3>("layer.a");
  EXPECT_EQ(std::memcmp(a_back.data(), a.data(), sizeof(float) * 24), 0);
  EXPECT_EQ(f.info("b").dtype, "F64");
  const Tensor<double, 2> b_back = f.tensor<double, 2>("b");
  EXPECT_EQ(std::memcmp(b_back.data(), b.data(), sizeof(double) * 10), 0);
  EXPECT_EQ((f.tensor<float, 2>("empty").shape()), (std::array<Index, 2>{0, 3}));
  EXPECT_TRUE(f.info("scalar").shape.empty());
  EXPECT_EQ((f.tensor<double, 1>("scalar")(0)), 2.5);  // 0-d reads as shape (1)

  const std::string path = ::testing::TempDir() + "selfattn_roundtrip.safetensors";
  w.write(path);
  const SafetensorsFile g = read_safetensors(path);
  std::filesystem::remove(path);
  EXPECT_EQ(g.array<float>("layer.a").shape, (std::vector<Index>{2, 3, 4}));

  expect_error<std::invalid_argument>([&] { w.add("b", b); }, {"duplicate tensor name 'b'"});
  expect_error<std::invalid_argument>([&] { w.add("__metadata__", b); }, {"reserved"});
}

TEST(SafetensorsRead, HalfAndBfloat16ConvertExactly) {
  // F16: 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), +inf, -0, NaN.
  const std::string f16 = le16({0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x7c00, 0x8000, 0x7e00});
  // BF16: 1, -3, the float32 max's top half, +inf.
  const std::string bf16 = le16({0x3f80, 0xc040, 0x7f7f, 0x7f80});
  const std::string header = R"({"h":{"dtype":"F16","shape":[8],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[16,24]}})";
  const std::string bytes = make_file(header, f16 + bf16);
  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  const NdArray<float> h = f.array<float>("h");
  EXPECT_EQ(h.values[0], 1.0f);
  EXPECT_EQ(h.values[1], -2.0f);
  EXPECT_EQ(h.values[2], 65504.0f);
  EXPECT_EQ(h.values[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h.values[4], std::ldexp(1.0f, -14));
  EXPECT_EQ(h.values[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h.values[6], 0.0f);
  EXPECT_TRUE(std::signbit(h.values[6]));
  EXPECT_TRUE(std::isnan(h.values[7]));
  const Tensor<double, 2> b = f.tensor<double, 2>("b");
  EXPECT_EQ(b(0, 0), 1.0);
  EXPECT_EQ(b(0, 1), -3.0);
  EXPECT_EQ(b(1, 0), static_cast<double>(std::ldexp(255.0f / 128.0f, 127)));  // 0x7f7f: (1 + 127/128) 2^127
  EXPECT_EQ(b(1, 1), std::numeric_limits<double>::infinity());
}

TEST(SafetensorsRead, OtherDtypesParseButDoNotReadAsFloat) {
  const std::string header = R"({"steps":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                             R"("attn.w":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  const std::string bytes = make_file(header, std::string(12, '\0'));
  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  expect_error<FormatError>([&] { f.array<float>("steps"); }, {"'steps'", "I64", "F32, F64, F16, BF16"});
  // A prefix selects only the float tensors of interest.
  const StateDict<float> sd = state_dict_from_safetensors<float>(f, "attn.");
  EXPECT_EQ(sd.size(), 1u);
  EXPECT_EQ(sd.count("attn.w"), 1u);
  EXPECT_THROW(state_dict_from_safetensors<float>(f), FormatError);
}

// ---- Malformed input ----------------------------------------------------------------------------------------

TEST(SafetensorsMalformed, EveryTruncationIsAnError) {
  test::Random random(22);
  SafetensorsWriter w;
  w.add("x", random.normal_tensor<float, 2>({3, 4}));
  w.add("y", random.normal_tensor<double, 1>({2}));
  const std::string bytes = w.encode();
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    const std::string cut = bytes.substr(0, size);
    EXPECT_THROW(parse_safetensors(cut.data(), cut.size()), FormatError) << "prefix of " << size << " bytes";
  }
  expect_format_error(bytes.substr(0, 5), {"truncated", "5 bytes"});
  expect_format_error(bytes.substr(0, bytes.size() - 1), {"run past the data section"});
  expect_format_error(bytes + "x", {"the data section has 65 bytes but the tensors cover 64"});
}

TEST(SafetensorsMalformed, HeaderLength) {
  const std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  const std::string data(4, '\0');
  ASSERT_NO_THROW(parse_safetensors(make_file(header, data).data(), make_file(header, data).size()));
  expect_format_error(make_file(header, data, header.size() + 5), {"header length is", "only 58 follow"});
  expect_format_error(make_file(header, data, std::numeric_limits<std::uint64_t>::max()), {"header length is 18446744073709551615"});
  expect_format_error(make_file(header, data, header.size() - 3), {"bad JSON"});
}

TEST(SafetensorsMalformed, HeaderContents) {
  const std::string four(4, '\0');
  const auto check = [&](const std::string& header, const std::string& data, const std::vector<std::string>& fragments) {
    SCOPED_TRACE(header);
    expect_format_error(make_file(header, data), fragments);
  };
  check("{\"x\": ", four, {"bad JSON"});
  check("\xff\xfe", four, {"bad JSON"});
  check(R"(["x"])", four, {"not an object"});
  check(R"({"x":[1]})", four, {"tensor 'x'", "expected an object"});
  check(R"({"x":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", four, {"unknown dtype 'F33'"});
  check(R"({"x":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", four, {"dtype is not a string"});
  check(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four, {"shape", "negative integer"});
  check(R"({"x":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four, {"shape", "got number"});
  check(R"({"x":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", four, {"shape is not an array"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", four, {"data_offsets is not an array [begin, end]"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four, {"reversed"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", four, {"run past the data section of 4 bytes"});
  check(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four, {"shape (2,) of F32 needs 2 x 4 bytes", "span 4"});
  check(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,4]}})", four, {"needs 1 x 8 bytes"});
  check(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", four, {"missing dtype"});
  check(R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", four, {"missing shape"});
  check(R"({"x":{"dtype":"F32","shape":[1]}})", four, {"missing data_offsets"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"bias":1}})", four, {"unexpected field 'bias'"});
  check(R"({"__metadata__":{"a":1},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four, {"__metadata__", "not a string"});
  check(R"({"__metadata__":[],"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four, {"__metadata__"});
  // Overlap, hole, and bytes no tensor covers.
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
        four, {"overlap"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
        std::string(12, '\0'), {"hole", "[4, 8)"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, '\0'), {"cover 4"});
  // Element counts that overflow, with or without a zero extent; a huge but representable one.
  check(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "", {"overflows"});
  check(R"({"x":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "", {"overflows"});
  check(R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})", "", {"extent too large"});
  check(R"({"x":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", "", {"needs 4611686018427387904 x 8"});
  check(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,99999999999999999999]}})", four, {"data_offsets", "got number"});
  std::string deep = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"deep":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}}";
  check(deep, four, {"unexpected field 'deep'"});
}

// A file cut short inside its last tensor: the header is valid and promises 16 bytes of data, 12 are present.
// tests/fuzz/corpus/io/st-short_data is this file (after the byte that picks the parser), so the fuzz replay
// runs it too.
TEST(SafetensorsMalformed, ShortDataSectionIsAFormatError) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  const std::string data = le16({0, 0x3f80, 0, 0x4000, 0, 0x4040, 0, 0x4080});  // 1, 2, 3, 4 as F32
  const std::string whole = make_file(header, data);
  ASSERT_EQ(parse_safetensors(whole.data(), whole.size()).array<float>("b").values, (std::vector<float>{3, 4}));
  const std::string cut = make_file(header, data.substr(0, 12));
  expect_format_error(cut, {"tensor 'b'", "data_offsets [8, 16] run past the data section of 12 bytes"});
  std::ifstream corpus(std::string(SELFATTN_FIXTURE_DIR) + "/../fuzz/corpus/io/st-short_data", std::ios::binary);
  const std::string corpus_bytes((std::istreambuf_iterator<char>(corpus)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(corpus_bytes == '\x02' + cut) << "tests/fuzz/corpus/io/st-short_data";
}

TEST(SafetensorsMalformed, CorruptedBytesNeverCrash) {
  SafetensorsWriter w;
  w.add("a", Tensor<float, 2>({2, 2}));
  w.add("b", Tensor<double, 1>({3}));
  const std::string good = w.encode();
  const std::size_t header_end = 8 + detail::load_le(reinterpret_cast<const unsigned char*>(good.data()), 8);
  int errors = 0, parsed = 0;
  for (std::size_t at = 0; at < header_end; ++at)
    for (const char value : {'\0', '\xff', '"', '[', ']', '{', '}', ',', ':', '9', '-', ' '}) {
      std::string bytes = good;
      bytes[at] = value;
      try {
        const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
        for (const std::string& name : f.names()) (void)f.array<double>(name);
        ++parsed;
      } catch (const FormatError&) {
        ++errors;
      }
    }
  EXPECT_GT(errors, 0);
  EXPECT_GT(parsed, 0);
}

// ---- Eigen::half and Eigen::bfloat16 --------------------------------------------------------------------------

namespace {

std::uint16_t bits_of(Eigen::half h) { return detail::element_bits(h); }
std::uint16_t bits_of(Eigen::bfloat16 b) { return detail::element_bits(b); }

template <typename T>
Tensor<T, 1> every_bit_pattern() {
  Tensor<T, 1> t({65536});
  for (Index n = 0; n < 65536; ++n) t(n) = detail::element_from_bits<T>(static_cast<std::uint16_t>(n));
  return t;
}

std::string half_fixture(const std::string& name) { return std::string(SELFATTN_FIXTURE_DIR) + "/half/" + name; }

bool is_nan_bits(Eigen::half h) { return (bits_of(h) & 0x7fff) > 0x7c00; }
bool is_nan_bits(Eigen::bfloat16 b) { return (bits_of(b) & 0x7fff) > 0x7f80; }

// Bit for bit, except that two NaNs match whatever their sign and payload (PyTorch's float -> bfloat16 makes
// every NaN +0x7fc0, Eigen's keeps the sign).
template <typename T>
void expect_same_bits(const NdArray<T>& got, const NdArray<T>& expected, const std::string& what) {
  ASSERT_EQ(got.shape, expected.shape) << what;
  for (std::size_t i = 0; i < got.values.size(); ++i) {
    if (is_nan_bits(expected.values[i])) {
      EXPECT_TRUE(is_nan_bits(got.values[i])) << what << " [" << i << "]";
    } else {
      EXPECT_EQ(bits_of(got.values[i]), bits_of(expected.values[i])) << what << " [" << i << "]";
    }
  }
}

}  // namespace

TEST(SafetensorsHalf, RoundTripBitExact) {
  // Every 16-bit pattern in each format, NaN payloads included: written in the tensor's own dtype, read as it.
  const Tensor<Eigen::half, 1> half = every_bit_pattern<Eigen::half>();
  const Tensor<Eigen::bfloat16, 1> bfloat16 = every_bit_pattern<Eigen::bfloat16>();
  Tensor<Eigen::bfloat16, 3> cube({3, 4, 2});
  for (Index n = 0; n < 24; ++n) cube.data()[n] = Eigen::bfloat16(0.5f * static_cast<float>(n) - 2.0f);
  SafetensorsWriter w;
  w.add("half", half);
  w.add("bfloat16", bfloat16);
  w.add("permuted", TensorView<const Eigen::bfloat16, 3>(cube).permute({1, 0, 2}));  // (4, 3, 2), strided
  w.add("scalar", NdArray<Eigen::half>{{}, {Eigen::half(-0.0f)}});
  w.add("float", Tensor<float, 1>({2}));  // dtypes mix in one file
  const std::string bytes = w.encode();
  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(f.info("half").dtype, "F16");
  EXPECT_EQ(f.info("bfloat16").dtype, "BF16");
  EXPECT_EQ(f.info("scalar").dtype, "F16");
  EXPECT_EQ(f.info("float").dtype, "F32");
  EXPECT_EQ(f.info("half").end - f.info("half").begin, 2u * 65536);
  const Tensor<Eigen::half, 1> half_back = f.tensor<Eigen::half, 1>("half");
  const Tensor<Eigen::bfloat16, 1> bfloat16_back = f.tensor<Eigen::bfloat16, 1>("bfloat16");
  EXPECT_EQ(std::memcmp(half_back.data(), half.data(), 2 * 65536), 0);
  EXPECT_EQ(std::memcmp(bfloat16_back.data(), bfloat16.data(), 2 * 65536), 0);
  const Tensor<Eigen::bfloat16, 3> permuted = f.tensor<Eigen::bfloat16, 3>("permuted");
  ASSERT_EQ(permuted.shape(), (std::array<Index, 3>{4, 3, 2}));
  for (Index i = 0; i < 4; ++i)
    for (Index j = 0; j < 3; ++j)
      for (Index k = 0; k < 2; ++k) EXPECT_EQ(bits_of(permuted(i, j, k)), bits_of(cube(j, i, k)));
  EXPECT_EQ(bits_of(f.array<Eigen::half>("scalar").values.at(0)), 0x8000);
  // Read as float, F16 and BF16 widen exactly (compared with Eigen's conversions, a second implementation).
  const NdArray<float> half_as_float = f.array<float>("half");
  const NdArray<double> bfloat16_as_double = f.array<double>("bfloat16");
  for (Index n = 0; n < 65536; ++n) {
    const float h = static_cast<float>(half(n)), b = static_cast<float>(bfloat16(n));
    const auto i = static_cast<std::size_t>(n);
    if (std::isnan(h)) {
      ASSERT_TRUE(std::isnan(half_as_float.values[i])) << n;
    } else {
      ASSERT_EQ(detail::element_bits(half_as_float.values[i]), detail::element_bits(h)) << n;
    }
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(bfloat16_as_double.values[i])) << n;
    } else {
      ASSERT_EQ(detail::element_bits(bfloat16_as_double.values[i]), detail::element_bits(static_cast<double>(b))) << n;
    }
  }
}

TEST(SafetensorsHalf, StateDictRoundTripThroughAFile) {
  StateDict<Eigen::bfloat16> sd;
  sd["layer.weight"] = NdArray<Eigen::bfloat16>{{2, 2}, {Eigen::bfloat16(1.0f), Eigen::bfloat16(-0.0f),
                                                         Eigen::numext::bit_cast<Eigen::bfloat16>(std::uint16_t{0x0001}),
                                                         Eigen::bfloat16(3e38f)}};
  sd["layer.bias"] = NdArray<Eigen::bfloat16>{{2}, {Eigen::bfloat16(0.1f), Eigen::bfloat16(-65504.0f)}};
  SafetensorsWriter w;
  for (const auto& entry : sd) w.add(entry.first, entry.second);
  const std::string path = ::testing::TempDir() + "selfattn_bfloat16_state_dict.safetensors";
  w.write(path);
  const StateDict<Eigen::bfloat16> back = read_state_dict_safetensors<Eigen::bfloat16>(path, "layer.");
  const StateDict<float> as_float = read_state_dict_safetensors<float>(path);
  std::filesystem::remove(path);
  ASSERT_EQ(back.size(), 2u);
  for (const auto& entry : sd) {
    SCOPED_TRACE(entry.first);
    const NdArray<Eigen::bfloat16>& got = back.at(entry.first);
    ASSERT_EQ(got.shape, entry.second.shape);
    EXPECT_EQ(std::memcmp(got.values.data(), entry.second.values.data(), 2 * entry.second.values.size()), 0);
    for (std::size_t i = 0; i < got.values.size(); ++i)
      EXPECT_EQ(detail::element_bits(as_float.at(entry.first).values[i]),
                static_cast<std::uint32_t>(bits_of(entry.second.values[i])) << 16);
  }
}

TEST(SafetensorsHalf, ConversionsBetweenDtypes) {
  // F16 -> bfloat16 and BF16 -> half go through float (exact) and round once; F32/F64 -> 16 bits round once.
  const std::string f16 = le16({0x3c04, 0x3c0c, 0x7bff, 0x0001, 0xfc00});  // 1+2^-8 (tie), 1+3*2^-8 (tie), 65504, 2^-24, -inf
  const std::string bf16 = le16({0x4780, 0x3f81, 0x3380, 0x3300, 0x0001});  // 2^16, 1+2^-7, 2^-24, 2^-25 (tie), 2^-133
  std::string f32, f64;
  for (std::uint32_t bits : {0x3f801000u, 0x3f808000u, 0x3f818000u}) detail::store_le(f32, bits, 4);
  for (double x : {1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)})
    detail::store_le(f64, detail::element_bits(x), 8);
  const std::string header = R"({"a":{"dtype":"F16","shape":[5],"data_offsets":[0,10]},)"
                             R"("b":{"dtype":"BF16","shape":[5],"data_offsets":[10,20]},)"
                             R"("c":{"dtype":"F32","shape":[3],"data_offsets":[20,32]},)"
                             R"("d":{"dtype":"F64","shape":[2],"data_offsets":[32,48]}})";
  const std::string bytes = make_file(header, f16 + bf16 + f32 + f64);
  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  const auto bits = [](const auto& array) {
    std::vector<std::uint16_t> out;
    for (const auto& v : array.values) out.push_back(bits_of(v));
    return out;
  };
  // 65504 is 0x477fe000 in float: between bfloat16 65280 (0x477f) and 65536 (0x4780), nearer 65536.
  EXPECT_EQ(bits(f.array<Eigen::bfloat16>("a")), (std::vector<std::uint16_t>{0x3f80, 0x3f82, 0x4780, 0x3380, 0xff80}));
  EXPECT_EQ(bits(f.array<Eigen::half>("b")), (std::vector<std::uint16_t>{0x7c00, 0x3c08, 0x0001, 0x0000, 0x0000}));
  EXPECT_EQ(bits(f.array<Eigen::half>("c")), (std::vector<std::uint16_t>{0x3c00, 0x3c04, 0x3c0c}));  // exact but the tie
  EXPECT_EQ(bits(f.array<Eigen::bfloat16>("c")), (std::vector<std::uint16_t>{0x3f80, 0x3f80, 0x3f82}));
  EXPECT_EQ(bits(f.array<Eigen::half>("d")), (std::vector<std::uint16_t>{0x3c01, 0x3c04}));  // rounded once
  EXPECT_EQ(bits(f.array<Eigen::bfloat16>("d")), (std::vector<std::uint16_t>{0x3f80, 0x3f81}));
}

TEST(SafetensorsHalf, NonFloatDtypeIntoHalfIsAnError) {
  const std::string bytes = make_file(R"({"steps":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}})", std::string(2, '\0'));
  const SafetensorsFile f = parse_safetensors(bytes.data(), bytes.size());
  expect_error<FormatError>([&] { f.array<Eigen::half>("steps"); }, {"'steps'", "I16", "F32, F64, F16, BF16"});
  expect_error<FormatError>([&] { state_dict_from_safetensors<Eigen::bfloat16>(f); }, {"I16"});
}

TEST(SafetensorsHalf, MatchesPyTorchAndNumPy) {
  // tests/fixtures/half/half_bf16.safetensors: sources and what PyTorch 1.13 / NumPy made of them, each checked
  // by the generator against an exact rational rounding.
  const SafetensorsFile f = read_safetensors(half_fixture("half_bf16.safetensors"));
  EXPECT_EQ(f.metadata().at("source"), "make_half_fixtures.py");
  EXPECT_EQ(f.info("f16.specials").dtype, "F16");
  EXPECT_EQ(f.info("bf16.specials").dtype, "BF16");
  expect_same_bits(f.array<Eigen::half>("f32.source"), f.array<Eigen::half>("f32.as_f16"), "float32 -> float16");
  expect_same_bits(f.array<Eigen::bfloat16>("f32.source"), f.array<Eigen::bfloat16>("f32.as_bf16"), "float32 -> bfloat16");
  expect_same_bits(f.array<Eigen::bfloat16>("f16.specials"), f.array<Eigen::bfloat16>("f16.as_bf16"), "float16 -> bfloat16");
  expect_same_bits(f.array<Eigen::half>("bf16.specials"), f.array<Eigen::half>("bf16.as_f16"), "bfloat16 -> float16");
  expect_same_bits(f.array<Eigen::half>("f64.source"), f.array<Eigen::half>("f64.as_f16"), "float64 -> float16 (NumPy)");
  expect_same_bits(f.array<Eigen::bfloat16>("f64.source"), f.array<Eigen::bfloat16>("f64.as_bf16"), "float64 -> bfloat16");
  // PyTorch's float64 -> float16 rounds through float32: element 0 (1 + 2^-11 + 2^-40) is where it differs.
  EXPECT_EQ(bits_of(f.array<Eigen::half>("f64.as_f16_torch").values.at(0)), 0x3c00);
  EXPECT_EQ(bits_of(f.array<Eigen::half>("f64.source").values.at(0)), 0x3c01);

  // F16 and BF16 widen exactly to float: compare with the values Eigen's conversions give from the raw bits.
  const NdArray<Eigen::half> f16 = f.array<Eigen::half>("f16.specials");
  const NdArray<float> f16_as_float = f.array<float>("f16.specials");
  for (std::size_t i = 0; i < f16.values.size(); ++i) {
    const float expected = static_cast<float>(f16.values[i]);
    if (std::isnan(expected))
      EXPECT_TRUE(std::isnan(f16_as_float.values[i]));
    else
      EXPECT_EQ(detail::element_bits(f16_as_float.values[i]), detail::element_bits(expected)) << i;
  }
  // The same float16 values saved by np.save, and the bfloat16 ones as PyTorch users save them (t.float()):
  // both .npy files read back into the same bits.
  expect_same_bits(read_npy_array<Eigen::half>(half_fixture("f2_specials.npy")), f16, "np.save float16");
  expect_same_bits(read_npy_array<Eigen::bfloat16>(half_fixture("bf16_specials_as_f4.npy")),
                   f.array<Eigen::bfloat16>("bf16.specials"), "bfloat16 saved as float32");

  // Re-encoding every tensor in its own dtype gives the generator's file byte for byte: same header (sorted
  // keys, compact JSON, padding), same data.
  SafetensorsWriter w;
  for (const std::string& name : f.names()) {
    const std::string& dtype = f.info(name).dtype;
    if (dtype == "F16") w.add(name, f.array<Eigen::half>(name));
    else if (dtype == "BF16") w.add(name, f.array<Eigen::bfloat16>(name));
    else if (dtype == "F32") w.add(name, f.array<float>(name));
    else w.add(name, f.array<double>(name));
  }
  for (const auto& entry : f.metadata()) w.add_metadata(entry.first, entry.second);
  EXPECT_EQ(w.encode(), detail::read_binary_file("test", half_fixture("half_bf16.safetensors")));
}

#else

TEST(Safetensors, SkippedWithoutNlohmannJson) { GTEST_SKIP() << "nlohmann/json.hpp not found: io/safetensors.hpp is empty"; }

#endif
