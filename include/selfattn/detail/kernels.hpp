// selfattn/detail/kernels.hpp — the fast kernels, compiled once per instruction-set level.
//
// The kernels' text (kernels/*.inc) is written once against Eigen's packet vocabulary (pset1, pmadd, ...) through
// the name `vec`, and included here several times:
//   selfattn::detail             the generic level: vec = Eigen::internal, so the packets are whatever the user's
//                                flags give Eigen (SSE2 in a default build, AVX-512 under -march=native, NEON, ...)
//   selfattn::detail::isa_avx2   AVX2 + FMA, compiled for that target whatever the flags (packets_avx2.hpp)
//   selfattn::detail::isa_avx512 AVX-512 F/BW/DQ/VL (packets_avx512.hpp)
// Each level lives in its own namespace, so no inline function is compiled for two targets under one name (the ODR
// trap of mixing -m flags), and the dispatched levels are the same code in every translation unit. Which level
// runs is decided in one place, dispatch.hpp. docs/dispatch.md explains the design and its measurements.
#pragma once

#include <selfattn/detail/decode_rows.hpp>
#include <selfattn/detail/decode_scratch.hpp>
#include <selfattn/detail/fused_scratch.hpp>
#include <selfattn/detail/isa_target.hpp>
#include <selfattn/detail/mask.hpp>
#include <selfattn/detail/params.hpp>
#include <selfattn/detail/simd.hpp>
#include <selfattn/detail/softmax.hpp>
#include <selfattn/detail/threads.hpp>
#include <selfattn/half_precision.hpp>
#include <selfattn/quantized.hpp>
#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(EIGEN_VECTORIZE_SSE2) || SELFATTN_DISPATCH_X86
#include <immintrin.h>
#endif

#if SELFATTN_DISPATCH_X86
#include <selfattn/detail/packets_avx2.hpp>
#include <selfattn/detail/packets_avx512.hpp>
#endif

namespace selfattn::detail {
/// The 16-bit widening instructions a level's kernels may use (kernels/widen.inc).
struct Widening {
  bool avx512 = false;  ///< 16 lanes: vpmovzxwd + vpslld (bfloat16), vcvtph2ps (float16)
  bool avx2 = false;    ///< 8 lanes of bfloat16
  bool f16c = false;    ///< 8 or 4 lanes of float16
  bool sse2 = false;    ///< 4 lanes of bfloat16
};

/// A matrix operand of the GEMM (kernels/gemm.inc) read in place through two strides: element (i, k) at
/// data[i * rows + k * depth], so that a row-major matrix (rows = ld, depth = 1) and its transpose (rows = 1,
/// depth = ld) are both read without a copy.
template <typename T>
struct StridedMatrix {
  const T* data;
  Index rows, depth;
};

/// The most rows linear_few_rows takes (kernels/linear_few_rows.inc: its row pointers live on the stack).
inline constexpr Index few_rows_max = 16;
}  // namespace selfattn::detail

// The generic level: Eigen's packets at the translation unit's flags.
namespace selfattn::detail {
namespace vec = ::Eigen::internal;
inline constexpr Widening widening{
#if defined(EIGEN_VECTORIZE_AVX512)
    true,
#else
    false,
#endif
#if defined(EIGEN_VECTORIZE_AVX2)
    true,
#else
    false,
#endif
#if defined(__F16C__)
    true,
#else
    false,
#endif
#if defined(EIGEN_VECTORIZE_SSE2)
    true,
#else
    false,
#endif
};
/// This level's namespace, for calls the arguments' namespace (selfattn::detail) would make ambiguous.
namespace level = ::selfattn::detail;
/// Vector registers the micro-kernels may plan for (kernels/microkernels.inc).
inline constexpr int vector_registers = EIGEN_ARCH_DEFAULT_NUMBER_OF_REGISTERS;
#include <selfattn/detail/kernels/all.inc>
}  // namespace selfattn::detail

#if SELFATTN_DISPATCH_X86

SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX2)
SELFATTN_VECTOR_WARNINGS_OFF
namespace selfattn::detail::isa_avx2 {
namespace vec = ::selfattn::detail::packets_avx2;
namespace level = ::selfattn::detail::isa_avx2;
inline constexpr int vector_registers = vec::registers;
inline constexpr Widening widening{false, true, true, true};
namespace micro {
using ::selfattn::detail::micro::Buffer;
using ::selfattn::detail::micro::GroupedQueries;
using ::selfattn::detail::micro::StreamingQueries;
}  // namespace micro
#include <selfattn/detail/kernels/all.inc>
}  // namespace selfattn::detail::isa_avx2
SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END

SELFATTN_TARGET_BEGIN(SELFATTN_ISA_FEATURES_AVX512)
SELFATTN_VECTOR_WARNINGS_OFF
namespace selfattn::detail::isa_avx512 {
namespace vec = ::selfattn::detail::packets_avx512;
namespace level = ::selfattn::detail::isa_avx512;
inline constexpr int vector_registers = vec::registers;
inline constexpr Widening widening{true, true, true, true};
namespace micro {
using ::selfattn::detail::micro::Buffer;
using ::selfattn::detail::micro::GroupedQueries;
using ::selfattn::detail::micro::StreamingQueries;
}  // namespace micro
#include <selfattn/detail/kernels/all.inc>
}  // namespace selfattn::detail::isa_avx512
SELFATTN_VECTOR_WARNINGS_ON
SELFATTN_TARGET_END

#endif
