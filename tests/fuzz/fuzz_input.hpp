// tests/fuzz/fuzz_input.hpp — turns a fuzzer's bytes into the choices of one test case.
//
// Every read past the end returns 0, so any byte string (the empty one too) is a valid case; libFuzzer's
// mutations of one byte then move one choice (a length, a flag, a mask bit) rather than shifting the rest.
#pragma once

#include <cstddef>
#include <cstdint>

namespace selfattn::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }

  /// An integer in [lo, hi], from one byte (two when the range needs it).
  long range(long lo, long hi) {
    const unsigned long span = static_cast<unsigned long>(hi - lo) + 1;
    unsigned long raw = byte();
    if (span > 256) raw = raw << 8 | byte();
    return lo + static_cast<long>(raw % span);
  }

  bool flag() { return byte() & 1; }

  std::uint64_t word() {
    std::uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w = w << 8 | byte();
    return w;
  }

  std::size_t remaining() const { return at_ < size_ ? size_ - at_ : 0; }
  const std::uint8_t* rest() const { return data_ + (at_ < size_ ? at_ : size_); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

}  // namespace selfattn::fuzz
