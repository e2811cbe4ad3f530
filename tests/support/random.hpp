// tests/support/random.hpp — seeded random tensors for tests. Same seed, same numbers, on any platform
// (our own uniform draw: std::uniform_real_distribution differs between standard libraries).
#pragma once

#include <selfattn/tensor.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>

namespace selfattn::test {

class Random {
 public:
  explicit Random(std::uint64_t seed) : generator_(seed) {}

  /// Uniform in [low, high).
  double uniform(double low = 0.0, double high = 1.0) {
    return low + (high - low) * static_cast<double>(generator_() >> 11) * 0x1.0p-53;
  }
  /// Uniform integer in [low, high].
  Index integer(Index low, Index high) {
    return low + static_cast<Index>(generator_() % static_cast<std::uint64_t>(high - low + 1));
  }
  /// Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  bool bernoulli(double p) { return uniform() < p; }

  template <typename T, int Rank>
  Tensor<T, Rank> normal_tensor(const std::array<Index, Rank>& shape, double stddev = 1.0) {
    Tensor<T, Rank> t(shape);
    for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<T>(stddev * normal());
    return t;
  }
  template <typename T, int Rank>
  Tensor<T, Rank> uniform_tensor(const std::array<Index, Rank>& shape, double low = -1.0, double high = 1.0) {
    Tensor<T, Rank> t(shape);
    for (Index n = 0; n < t.size(); ++n) t.data()[n] = static_cast<T>(uniform(low, high));
    return t;
  }
  template <int Rank>
  Tensor<bool, Rank> bool_tensor(const std::array<Index, Rank>& shape, double p_true) {
    Tensor<bool, Rank> t(shape);
    for (Index n = 0; n < t.size(); ++n) t.data()[n] = bernoulli(p_true);
    return t;
  }
  std::mt19937_64& engine() { return generator_; }

 private:
  std::mt19937_64 generator_;
};

}  // namespace selfattn::test
