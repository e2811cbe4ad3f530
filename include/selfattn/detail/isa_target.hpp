// selfattn/detail/isa_target.hpp — compiling a stretch of code for one instruction-set level, whatever flags the
// translation unit has: the functions defined between SELFATTN_TARGET_BEGIN_x and SELFATTN_TARGET_END (lambdas and
// template instances included) carry the target attribute, so their intrinsics and vectors are that level's. The
// code inside must live in a namespace of its own level (packets_avx2, isa_avx2, ...): an inline function compiled
// for two targets under one name is an ODR violation (docs/dispatch.md).
//
// g++ takes `#pragma GCC target`; clang++ takes `#pragma clang attribute push` (it ignores the former for this).
#pragma once

#include <selfattn/cpu.hpp>

#if SELFATTN_DISPATCH_X86

#define SELFATTN_ISA_FEATURES_AVX2 "avx2,fma,f16c,bmi,bmi2,popcnt,lzcnt"
#define SELFATTN_ISA_FEATURES_AVX512 SELFATTN_ISA_FEATURES_AVX2 ",avx512f,avx512bw,avx512dq,avx512vl,avx512cd"
#define SELFATTN_ISA_FEATURES_AVX512_BF16 SELFATTN_ISA_FEATURES_AVX512 ",avx512bf16"

#if defined(__clang__)
#define SELFATTN_PRAGMA(text) _Pragma(#text)
#define SELFATTN_TARGET_BEGIN(features) \
  SELFATTN_PRAGMA(clang attribute push(__attribute__((target(features))), apply_to = function))
#define SELFATTN_TARGET_END _Pragma("clang attribute pop")
#else
#define SELFATTN_PRAGMA(text) _Pragma(#text)
#define SELFATTN_TARGET_BEGIN(features) _Pragma("GCC push_options") SELFATTN_PRAGMA(GCC target(features))
#define SELFATTN_TARGET_END _Pragma("GCC pop_options")
#endif

// g++ 12 warns about code that is not ours: the vector types' alignment attributes dropped from template arguments
// (harmless for traits), and `__Y` "used uninitialized" inside its own AVX-512 headers' _mm512_undefined_ps()
// (GCC bug 105593), reported at our call sites once inlined. Both are off inside the level's code, nowhere else.
#if defined(__GNUC__) && !defined(__clang__)
#define SELFATTN_VECTOR_WARNINGS_OFF                                                              \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wignored-attributes\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")                                  \
          _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define SELFATTN_VECTOR_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SELFATTN_VECTOR_WARNINGS_OFF
#define SELFATTN_VECTOR_WARNINGS_ON
#endif

#endif
