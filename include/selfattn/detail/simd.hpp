// selfattn/detail/simd.hpp — what the fast kernels share whatever their instruction set: aligned scratch memory and
// the inlining macro. The packets and loops are in kernels/vocabulary.inc, compiled once per level (kernels.hpp).
//
// Everything is written with Eigen's packet math (Eigen::internal::pload / pmadd / pexp ...), so it adapts to
// whatever SIMD the user compiles for (SSE2, AVX2, AVX-512, NEON, or plain scalars) without a single -march
// flag on the library.
#pragma once

#include <selfattn/tensor.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

/// Forces a lambda inline (after its parameter list): an epilogue that is not inlined makes the compiler spill
/// the micro-kernel's accumulators to memory to pass them (measured: 4% of the forward).
#if defined(__GNUC__) || defined(__clang__)
#define SELFATTN_INLINE_LAMBDA __attribute__((always_inline))
#else
#define SELFATTN_INLINE_LAMBDA
#endif

namespace selfattn::detail::micro {

/// A cache-line (64-byte) aligned allocator through C++17's aligned operator new, so scratch memory is
/// counted by anything that counts operator new (tests/fused_test.cpp does).
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::size_t alignment = 64;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignment)));
  }
  void deallocate(T* pointer, std::size_t) noexcept { ::operator delete(pointer, std::align_val_t(alignment)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept { return false; }
};

/// 64-byte aligned scratch memory.
template <typename T>
using Buffer = std::vector<T, AlignedAllocator<T>>;

}  // namespace selfattn::detail::micro
