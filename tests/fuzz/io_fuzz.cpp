// tests/fuzz/io_fuzz.cpp — libFuzzer target for the file parsers: .npy, .safetensors and the state-dict mapping.
//
// The first byte picks the parser, the rest is the file. A parser must either throw std::invalid_argument
// (FormatError, ShapeError) or return arrays whose element count matches their shape; an accepted .npy must
// survive encode -> parse bit for bit (bfloat16: NaN as NaN, its payload is not kept, docs/interop.md). The float
// .npy choice also reads the file as float16 and bfloat16, and every safetensors tensor is read in all four types. Any other exception, a crash or a sanitizer report is a finding.
// Built like attention_fuzz.cpp (tests/fuzz/CMakeLists.txt): libFuzzer binary and corpus replay.
#include <selfattn/io/npy.hpp>
#include <selfattn/io/safetensors.hpp>
#include <selfattn/io/state_dict.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace selfattn::fuzz {
namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "io_fuzz: %s\n", what.c_str());
  std::abort();
}

template <typename T>
void check_counts(const NdArray<T>& array, const char* what) {
  if (static_cast<Index>(array.values.size()) != array.size())
    finding(std::string(what) + ": " + std::to_string(array.values.size()) + " values for a shape of " +
            std::to_string(array.size()) + " elements");
}

/// encode_npy(parse(x)) parsed again gives the same bits (NaN payloads included).
template <int Rank, typename T>
void check_npy_round_trip(const NdArray<T>& array) {
  const std::string bytes = encode_npy(to_tensor<Rank>(array));
  const NdArray<T> again = parse_npy_array<T>(bytes.data(), bytes.size());
  const std::vector<Index> shape = array.shape.empty() ? std::vector<Index>{1} : array.shape;  // 0-d: as (1)
  if (again.shape != shape || again.values.size() != array.values.size()) finding("npy round trip changed the shape");
  for (std::size_t n = 0; n < array.values.size(); ++n) {
    const bool same_bits = std::memcmp(&again.values[n], &array.values[n], sizeof(T)) == 0;
    const bool both_nan = std::isnan(static_cast<double>(static_cast<float>(again.values[n]))) &&
                          std::isnan(static_cast<double>(static_cast<float>(array.values[n])));
    // bfloat16 travels as '<f4' (NumPy has no bfloat16): a NaN comes back a NaN, its payload not kept.
    if (!same_bits && !(std::is_same_v<T, Eigen::bfloat16> && both_nan)) finding("npy round trip changed the array");
  }
}

template <typename T>
void fuzz_npy(const char* data, std::size_t size) {
  NdArray<T> array;
  try {
    array = parse_npy_array<T>(data, size);
  } catch (const std::invalid_argument&) {
    return;
  }
  check_counts(array, "parse_npy_array");
  switch (array.shape.size()) {  // to_tensor needs a static rank; 0-d arrays read as rank 1
    case 0: case 1: check_npy_round_trip<1>(array); break;
    case 2: check_npy_round_trip<2>(array); break;
    case 3: check_npy_round_trip<3>(array); break;
    case 4: check_npy_round_trip<4>(array); break;
    default: break;
  }
}

#if SELFATTN_HAS_SAFETENSORS
void fuzz_safetensors(const char* data, std::size_t size) {
  SafetensorsFile file;
  try {
    file = parse_safetensors(data, size);
  } catch (const std::invalid_argument&) {
    return;
  }
  for (const std::string& name : file.names()) {
    try {
      check_counts(file.array<float>(name), "SafetensorsFile::array<float>");
      check_counts(file.array<double>(name), "SafetensorsFile::array<double>");
      check_counts(file.array<Eigen::half>(name), "SafetensorsFile::array<Eigen::half>");
      check_counts(file.array<Eigen::bfloat16>(name), "SafetensorsFile::array<Eigen::bfloat16>");
    } catch (const std::invalid_argument&) {  // a dtype that is not floating point
    }
  }
  // The names PyTorch's nn.MultiheadAttention uses, for a small module: any accepted file must map or throw.
  try {
    MultiHeadAttentionConfig config;
    config.embed_dim = 4;
    config.num_heads = 2;
    const StateDict<float> state = state_dict_from_safetensors<float>(file);
    const MhaParams<float> params = mha_params_from_state_dict(state, config);
    if (params.out_weight.dim(0) != 4) finding("mha_params_from_state_dict returned a wrong out_weight shape");
  } catch (const std::invalid_argument&) {
  }
}
#endif

}  // namespace
}  // namespace selfattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  if (size == 0) return 0;
  const char* data = reinterpret_cast<const char*>(bytes) + 1;
  switch (bytes[0] % 3) {
    case 0:
      selfattn::fuzz::fuzz_npy<float>(data, size - 1);
      selfattn::fuzz::fuzz_npy<Eigen::half>(data, size - 1);
      selfattn::fuzz::fuzz_npy<Eigen::bfloat16>(data, size - 1);
      break;
    case 1: selfattn::fuzz::fuzz_npy<double>(data, size - 1); break;
    default:
#if SELFATTN_HAS_SAFETENSORS
      selfattn::fuzz::fuzz_safetensors(data, size - 1);
#endif
      break;
  }
  return 0;
}
