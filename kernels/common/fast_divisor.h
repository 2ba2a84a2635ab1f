// Division of 32-bit unsigned integers by a divisor fixed before a launch: one multiply-high, one
// add and one shift instead of the ~20 instructions of a run-time division (Granlund and
// Montgomery, "Division by Invariant Integers using Multiplication", PLDI 1994, section 4).
// Host and device; nvcc-safe.
#pragma once

#include <cstdint>

#include "base/hd.h"

namespace kvp {

class FastDivisor {
 public:
  FastDivisor() = default;
  // divisor >= 1.
  explicit FastDivisor(uint32_t divisor) : divisor_(divisor) {
    while ((uint64_t{1} << shift_) < divisor) ++shift_;
    // m = floor(2^32 · (2^l - d) / d) + 1 with l = ceil(log2 d): then for every n < 2^32,
    // floor(n / d) = (floor(n · m / 2^32) + n) >> l, the sum taken in 33 bits.
    multiplier_ = static_cast<uint32_t>(
        (uint64_t{1} << 32) * ((uint64_t{1} << shift_) - divisor) / divisor + 1);
  }

  KVP_HD uint32_t divisor() const { return divisor_; }

  KVP_HD uint32_t Divide(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, multiplier_);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier_) >> 32);
#endif
    return static_cast<uint32_t>((uint64_t{high} + n) >> shift_);
  }

 private:
  uint32_t divisor_ = 1;
  uint32_t multiplier_ = 1;
  uint32_t shift_ = 0;
};

}  // namespace kvp
