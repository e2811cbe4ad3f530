// tests/fuzz/sizes_fuzz.cpp — libFuzzer target for the size checks: tensors, views, reshapes, KV caches and the
// workspaces' buffers built from fuzzed extents, strides and cache policies (extents near powers of two, near
// PTRDIFF_MAX, negative, zero).
//
// For each, the outcome is decided first from the rules, with the compiler's overflow builtins (not the library's
// checked_mul): which std::invalid_argument rules (negative extents, bad policies...) and which std::length_error
// rules (a count, span or byte size past PTRDIFF_MAX) the input breaks. Then:
//   - if it breaks some, the call must throw one of those types, a length_error with a message "[function]
//     argument: ... exceeds the limit of ..." (so never vector's or operator new's own);
//   - if it breaks none, the call must not throw; it runs only when what it allocates is small (kBudgetBytes), and
//     its result is checked (size, span, memory_bytes, max_capacity) and touched at its last element.
// Anything else (another exception, a missing one, a crash, a sanitizer report, a bad_alloc) aborts: a finding.
//
// Built like the other targets (tests/fuzz/CMakeLists.txt): the libFuzzer binary (SELFATTN_FUZZ=ON, clang) that
// scripts/fuzz runs, and a replay of corpus/sizes as the ctest test fuzz_replay_sizes.
#include "fuzz_input.hpp"

#include <selfattn/nn/kv_cache.hpp>
#include <selfattn/nn/module_workspace.hpp>
#include <selfattn/tensor.hpp>
#include <selfattn/workspace.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace selfattn::fuzz::sizes {
namespace {

constexpr Index kMax = std::numeric_limits<Index>::max();
constexpr Index kBudgetBytes = Index{1} << 20;  // what one case may allocate: small, so that ASan stays quick

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "sizes_fuzz: %s\n", what.c_str());
  std::abort();
}

/// What an input breaks: rules whose error is std::invalid_argument, rules whose error is std::length_error.
struct Expected {
  bool invalid = false;
  bool too_large = false;
  bool ok() const { return !invalid && !too_large; }
};

/// A size past PTRDIFF_MAX: the result of mul and add when the true value does not fit (their operands are >= 0,
/// so -1 never arises otherwise), and an operand they pass on.
constexpr Index kOver = -1;

// a * b and a + b for values >= 0, or kOver.
Index mul(Index a, Index b) {
  Index r = 0;
  return a == kOver || b == kOver || __builtin_mul_overflow(a, b, &r) ? kOver : r;
}
Index add(Index a, Index b) {
  Index r = 0;
  return a == kOver || b == kOver || __builtin_add_overflow(a, b, &r) ? kOver : r;
}

/// Whether `count` elements of `bytes` each exceed PTRDIFF_MAX bytes (a count of kOver does).
bool exceeds_memory(Index count, std::size_t bytes) {
  return mul(count, static_cast<Index>(bytes)) == kOver;
}

/// Bytes of `count` elements of `bytes` each, for the budget (kMax when past the limit).
Index bytes_of(Index count, std::size_t bytes) {
  const Index total = mul(count, static_cast<Index>(bytes));
  return total == kOver ? kMax : total;
}

/// The product of the nonzero extents (the library's rule: row-major strides multiply them), or kOver.
template <std::size_t N>
Index nonzero_product(const std::array<Index, N>& shape) {
  Index p = 1;
  for (Index e : shape)
    if (e != 0) p = mul(p, e);
  return p;
}
template <std::size_t N>
bool any_zero(const std::array<Index, N>& shape) {
  return std::any_of(shape.begin(), shape.end(), [](Index e) { return e == 0; });
}
template <std::size_t N>
bool any_negative(const std::array<Index, N>& values) {
  return std::any_of(values.begin(), values.end(), [](Index e) { return e < 0; });
}

/// An extent: mostly small, else near a power of two (2^k - 1, 2^k, 2^k + 1) up to 2^62, near PTRDIFF_MAX, or any
/// 64-bit value (negative ones included).
Index extent(FuzzInput& in) {
  switch (in.range(0, 5)) {
    case 0:
    case 1: return in.range(0, 9);
    case 2:
    case 3: return (Index{1} << in.range(0, 62)) + in.range(-1, 1);
    case 4: return kMax - in.range(0, 3);
    default: return static_cast<Index>(in.word());
  }
}

template <std::size_t N>
std::array<Index, N> extents(FuzzInput& in) {
  std::array<Index, N> shape{};
  for (Index& e : shape) e = extent(in);
  return shape;
}

/// Runs `call`, which must throw exactly when `expected` says so, a type it allows.
template <typename F>
void expect_outcome(const char* what, const Expected& expected, F&& call) {
  if (std::getenv("SELFATTN_FUZZ_VERBOSE"))  // triage: what this input decodes to
    std::fprintf(stderr, "%s: expected %s%s%s\n", what, expected.ok() ? "to work" : "",
                 expected.invalid ? "std::invalid_argument " : "", expected.too_large ? "std::length_error" : "");
  try {
    call();
  } catch (const std::length_error& e) {
    if (!expected.too_large) finding(std::string(what) + ": unexpected std::length_error: " + e.what());
    const std::string message = e.what();
    if (message.rfind("[", 0) != 0 || message.find("exceeds the limit of") == std::string::npos)
      finding(std::string(what) + ": std::length_error without the argument and the limit: " + message);
    return;
  } catch (const std::invalid_argument& e) {
    if (!expected.invalid) finding(std::string(what) + ": unexpected std::invalid_argument: " + e.what());
    return;
  } catch (const std::exception& e) {
    finding(std::string(what) + ": unexpected exception: " + e.what());
  }
  if (!expected.ok()) finding(std::string(what) + ": accepted, but the input breaks a rule");
}

/// Tensor<T, 3> of a fuzzed shape: allocated only within the budget.
template <typename T>
void tensor_case(FuzzInput& in) {
  const std::array<Index, 3> shape = extents<3>(in);
  Expected expected;
  expected.invalid = any_negative(shape);
  if (expected.invalid) return expect_outcome("Tensor", expected, [&] { Tensor<T, 3> t(shape); });
  const Index nonzero = nonzero_product(shape), count = any_zero(shape) ? 0 : nonzero;
  expected.too_large = exceeds_memory(nonzero, sizeof(T));
  if (expected.ok() && bytes_of(count, sizeof(T)) > kBudgetBytes) return;  // fine, but too large to allocate here
  expect_outcome("Tensor", expected, [&] {
    Tensor<T, 3> t(shape);
    if (t.size() != count) finding("Tensor: size() differs from the product of the extents");
    if (count > 0) t.data()[count - 1] = T(1);
  });
}

/// The rules of a view's constructor: negative extents or strides, a last stride other than 1 (more than one
/// element) are invalid; an element count past Index, or a span 1 + sum (dim - 1) * stride past PTRDIFF_MAX bytes,
/// too large. `span` is set to the span when the view is valid.
Expected view_rules(const std::array<Index, 3>& shape, const std::array<Index, 3>& strides, Index& span) {
  Expected expected;
  expected.invalid = any_negative(shape);
  if (expected.invalid) return expected;  // checked first: nothing else is computed
  const Index nonzero = nonzero_product(shape), count = any_zero(shape) ? 0 : nonzero;
  expected.too_large = nonzero == kOver;
  expected.invalid = (strides[2] != 1 && (count == kOver || count > 1)) || any_negative(strides);
  span = 0;
  if (count != 0 && !any_negative(strides)) {
    span = 1;
    for (std::size_t d = 0; d < 3; ++d) span = add(span, mul(shape[d] - 1, strides[d]));
    expected.too_large = expected.too_large || exceeds_memory(span, sizeof(float));
  }
  return expected;
}

/// TensorView<float, 3> over a small buffer, contiguous or with fuzzed strides; no allocation, so any shape runs.
/// A view within the buffer is copied (every element, through for_each_row's odometer); a view of more elements
/// than memory holds (stride 0) must refuse to be copied, named.
void view_case(FuzzInput& in, bool strided) {
  std::vector<float> buffer(64, 1.0f);
  const std::array<Index, 3> shape = extents<3>(in);
  std::array<Index, 3> strides{};
  if (strided) {
    strides = extents<3>(in);
    if (in.flag()) strides[2] = 1;
  }
  Index span = 0;
  Expected expected;
  if (strided) {
    expected = view_rules(shape, strides, span);
  } else {
    expected.invalid = any_negative(shape);
    expected.too_large = !expected.invalid && exceeds_memory(nonzero_product(shape), sizeof(float));
    span = expected.ok() && !any_zero(shape) ? nonzero_product(shape) : 0;
  }
  const Index count = expected.ok() && !any_zero(shape) ? nonzero_product(shape) : 0;
  expect_outcome(strided ? "TensorView (strided)" : "TensorView", expected, [&] {
    const TensorView<float, 3> v = strided ? TensorView<float, 3>(buffer.data(), shape, strides)
                                           : TensorView<float, 3>(buffer.data(), shape);
    if (v.size() != count) finding("TensorView: size() differs from the product of the extents");
    if (detail::memory_span(v) != span) finding("TensorView: memory_span differs from 1 + sum (dim - 1) * stride");
    (void)v.is_contiguous();
    (void)detail::overlaps_itself(v);
    if (count == 0) return;
    if (exceeds_memory(count, sizeof(float))) {
      Expected copy_expected;
      copy_expected.too_large = true;
      expect_outcome("Tensor (copy of a view)", copy_expected, [&] { Tensor<float, 3> copy(v); });
      return;
    }
    if (bytes_of(count, sizeof(float)) > kBudgetBytes || span > static_cast<Index>(buffer.size())) return;
    const Tensor<float, 3> copy(v);
    float sum = 0;  // exact: at most 2^18 ones
    for (Index n = 0; n < copy.size(); ++n) sum += copy.data()[n];
    if (sum != static_cast<float>(count)) finding("TensorView: a copy of a view of ones does not sum to its size");
  });
}

/// A reshape of a contiguous view of n <= 64 elements to a fuzzed 2-D shape: a size other than n is invalid, an
/// element count past Index too large, and so is the resulting view's when it exceeds PTRDIFF_MAX bytes (an empty
/// shape whose nonzero extents multiply past 2^61 floats).
void reshape_case(FuzzInput& in) {
  std::vector<float> buffer(64);
  const Index n = in.range(0, 64);
  const std::array<Index, 2> shape = extents<2>(in);
  Expected expected;
  expected.invalid = any_negative(shape);
  if (!expected.invalid) {
    const Index nonzero = nonzero_product(shape), count = any_zero(shape) ? 0 : nonzero;
    expected.too_large = nonzero == kOver || (count == n && exceeds_memory(nonzero, sizeof(float)));
    expected.invalid = nonzero != kOver && count != n;
  }
  expect_outcome("TensorView::reshape", expected, [&] {
    const TensorView<float, 2> r = TensorView<float, 1>(buffer.data(), {n}).reshape(shape);
    if (r.size() != n) finding("reshape: the result's size differs");
  });
}

/// A cache policy: each field small, near a power of two, huge, or negative.
CachePolicy policy(FuzzInput& in) {
  switch (in.range(0, 3)) {
    case 0: return CachePolicy::keep_all(in.flag() ? 0 : extent(in));
    case 1: return CachePolicy::sliding_window(extent(in));
    case 2: {
      const Index sinks = extent(in);
      return CachePolicy::attention_sinks(sinks, extent(in));
    }
    default: {
      CachePolicy p;
      p.sink_tokens = extent(in);
      p.window = extent(in);
      p.capacity = extent(in);
      return p;
    }
  }
}

/// Bytes of planes (B, Hkv, tokens, D) of `bytes`-byte elements, for the budget.
Index plane_bytes(Index batch, Index kv_heads, Index tokens, Index head_dim, std::size_t bytes) {
  const Index count = mul(mul(mul(batch, kv_heads), tokens), head_dim);
  return count == kOver ? kMax : bytes_of(count, bytes);
}

/// The rules of KVCache's constructor (see its documentation); `max_capacity`, `slots` (S + W + 1 or the fixed
/// capacity) and `bytes` (what it allocates) are set when the cache is valid.
template <typename S>
Expected cache_rules(Index batch, Index kv_heads, Index head_dim, const CachePolicy& p, Index& max_capacity,
                     Index& slots, Index& bytes) {
  const bool evicts = p.window >= 0;
  Expected expected;
  expected.invalid = batch < 0 || kv_heads < 1 || head_dim < 1 || p.window < -1 || p.window == 0 ||
                     p.sink_tokens < 0 || (p.sink_tokens > 0 && !evicts);
  if (expected.invalid) return expected;  // checked first: nothing else is computed
  const Index window_slots = evicts ? add(add(p.sink_tokens, p.window), 1) : 0;
  expected.too_large = window_slots == kOver;
  expected.invalid =
      p.capacity < 0 || (evicts && window_slots != kOver && p.capacity != 0 && p.capacity < window_slots);
  const Index rows = std::max<Index>(batch, 1);  // an empty batch's planes still multiply the other extents
  const Index slot_bytes = mul(mul(mul(rows, kv_heads), head_dim), 2 * static_cast<Index>(sizeof(S)));
  const Index sink_bytes = p.sink_tokens == 0 ? 0 : mul(mul(mul(mul(rows, kv_heads), p.sink_tokens), head_dim), 4);
  expected.too_large = expected.too_large || slot_bytes == kOver || sink_bytes == kOver;
  if (!expected.ok()) return expected;
  max_capacity = (kMax - sink_bytes) / slot_bytes;
  slots = p.capacity > 0 ? p.capacity : window_slots;
  expected.too_large = slots > max_capacity || exceeds_memory(batch, 2 * sizeof(Index));  // lengths, positions
  // Fixed-capacity planes and the sinks' keys; growing and windowed planes wait for the first append.
  const Index planes = p.capacity > 0 ? plane_bytes(batch, kv_heads, p.capacity, head_dim, 2 * sizeof(S)) : 0;
  const Index sinks = p.sink_tokens > 0 ? plane_bytes(batch, kv_heads, p.sink_tokens, head_dim, sizeof(float)) : 0;
  bytes = add(planes, sinks) == kOver ? kMax : add(planes, sinks);
  return expected;
}

/// A KVCache<float, S> of fuzzed batch, heads, head dim and policy; then a reserve and an append within budget.
template <typename S>
void cache_case(FuzzInput& in) {
  const Index batch = in.flag() ? in.range(-1, 3) : extent(in);
  const Index kv_heads = in.flag() ? in.range(0, 4) : extent(in);
  const Index head_dim = in.flag() ? in.range(0, 8) : extent(in);
  const CachePolicy p = policy(in);
  const bool evicts = p.window >= 0;
  Index max_capacity = 0, slots = 0, bytes = 0;
  const Expected expected = cache_rules<S>(batch, kv_heads, head_dim, p, max_capacity, slots, bytes);
  const Index scratch = p.sink_tokens > 0 ? bytes_of(head_dim, sizeof(float)) : 0;  // evict's rotated sink key
  const Index sequences = bytes_of(batch, 2 * sizeof(Index));  // lengths and positions
  if (expected.ok() && (bytes > kBudgetBytes || scratch > kBudgetBytes || sequences > kBudgetBytes)) return;
  const Index tokens = in.flag() ? in.range(0, 40) : extent(in);
  const Index n = in.range(0, 3);
  expect_outcome("KVCache", expected, [&] {
    KVCache<float, S> cache(batch, kv_heads, head_dim, p);
    if (cache.max_capacity() != max_capacity) finding("KVCache: max_capacity differs from the rule");
    if (static_cast<Index>(cache.memory_bytes()) != bytes) finding("KVCache: memory_bytes differs from the planes'");
    // reserve(tokens): a fixed capacity too small is std::invalid_argument, past max_capacity std::length_error; a
    // negative count asks for nothing.
    if (tokens >= 0) {
      Expected reserve_expected;
      reserve_expected.invalid = p.capacity > 0 && tokens > p.capacity;
      reserve_expected.too_large = tokens > max_capacity;
      const Index grown = std::max({tokens, p.capacity, evicts ? slots : Index{0}});
      if (!reserve_expected.ok() || plane_bytes(batch, kv_heads, grown, head_dim, 2 * sizeof(S)) <= kBudgetBytes)
        expect_outcome("KVCache::reserve", reserve_expected, [&] { cache.reserve(tokens); });
    }
    // n new tokens for sequence 0, when they and the planes they may grow to are within the budget.
    if (batch == 0 || bytes_of(mul(mul(kv_heads, std::max<Index>(n, 1)), head_dim), sizeof(float)) > 4096) return;
    const Index after = cache.lengths()[0] + n;
    if (p.capacity > 0 && after > p.capacity) return;
    const Index plane = std::max({after, evicts ? slots : Index{0}, p.capacity, 2 * cache.capacity()});
    if (plane_bytes(batch, kv_heads, plane, head_dim, 2 * sizeof(S)) > kBudgetBytes) return;
    Tensor<float, 3> keys({kv_heads, n, head_dim}), values({kv_heads, n, head_dim});
    keys.fill(1.0f);
    values.fill(2.0f);
    cache.append(0, keys, values);
    if (cache.lengths()[0] != (evicts ? std::min(after, p.sink_tokens + p.window) : after))
      finding("KVCache::append: the sequence's length differs from the policy's");
  });
}

/// AttentionWorkspace::reserve_decode of fuzzed counts >= 0: the partials hold pairs * chunks * lanes * (Dv + 2)
/// elements, chunks = ceil(keys / decode_chunk) (at least 1), lanes = rows rounded up to the widest packet of any
/// level (DecodeScratch::decode_lanes_multiple, 16 floats), whichever level runs.
void decode_workspace_case(FuzzInput& in) {
  std::array<Index, 4> counts = extents<4>(in);  // pairs, rows, keys, value_dim
  for (Index& c : counts) c = std::max<Index>(c, 0);
  const Index packet = detail::DecodeScratch<float>::decode_lanes_multiple, chunk = detail::decode_chunk;
  const Index lanes = mul(counts[1] / packet + (counts[1] % packet != 0), packet);
  const Index chunks = std::max<Index>(1, counts[2] / chunk + (counts[2] % chunk != 0));
  const std::array<Index, 4> partials{counts[0], chunks, lanes, add(counts[3], 2)};
  Expected expected;
  expected.too_large = exceeds_memory(nonzero_product(partials), sizeof(float));
  const Index count = any_zero(partials) ? 0 : nonzero_product(partials);
  if (expected.ok() && bytes_of(count, sizeof(float)) > kBudgetBytes) return;
  expect_outcome("AttentionWorkspace::reserve_decode", expected, [&] {
    AttentionWorkspace<float> ws;
    ws.reserve_decode(counts[0], counts[1], counts[2], counts[3]);
  });
}

/// MhaWorkspace::take of a fuzzed shape of extents >= 0.
void module_workspace_case(FuzzInput& in) {
  std::array<Index, 3> shape = extents<3>(in);
  for (Index& e : shape) e = std::max<Index>(e, 0);
  Expected expected;
  expected.too_large = exceeds_memory(nonzero_product(shape), sizeof(double));
  const Index count = any_zero(shape) ? 0 : nonzero_product(shape);
  if (expected.ok() && bytes_of(count, sizeof(double)) > kBudgetBytes) return;
  expect_outcome("MhaWorkspace::take", expected, [&] {
    std::vector<double> buffer;
    const TensorView<double, 3> v = MhaWorkspace<double>::take(buffer, shape);
    if (v.size() != count || static_cast<Index>(buffer.size()) < count) finding("MhaWorkspace::take: wrong size");
    if (count > 0) v.data()[count - 1] = 1.0;
  });
}

}  // namespace
}  // namespace selfattn::fuzz::sizes

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace selfattn::fuzz::sizes;  // NOLINT(google-build-using-namespace): a source file, not a header
  selfattn::fuzz::FuzzInput in(data, size);
  switch (in.range(0, 8)) {
    case 0: tensor_case<float>(in); break;
    case 1: tensor_case<double>(in); break;
    case 2: view_case(in, false); break;
    case 3: view_case(in, true); break;
    case 4: reshape_case(in); break;
    case 5: cache_case<float>(in); break;
    case 6: cache_case<selfattn::bfloat16>(in); break;
    case 7: decode_workspace_case(in); break;
    default: module_workspace_case(in); break;
  }
  return 0;
}
