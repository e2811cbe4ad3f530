// tests/safetensors_test.cpp — selfattn/io/safetensors.hpp: the file PyTorch's side wrote
// (examples/from_pytorch/data, by save_mha.py), round trips through SafetensorsWriter, F16/BF16 conversion,
// and every malformed case giving FormatError, never a crash. Skipped without nlohmann/json.
#include <selfattn/io/safetensors.hpp>

#include <gtest/gtest.h>

#if SELFATTN_HAS_SAFETENSORS

#include "support/expect_error.hpp"
#include "support/random.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
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

#else

TEST(Safetensors, SkippedWithoutNlohmannJson) { GTEST_SKIP() << "nlohmann/json.hpp not found: io/safetensors.hpp is empty"; }

#endif
