// The signed Walsh-Hadamard rotation of TurboNV values (docs/design.md §3, step 1):
//   forward  y = (1/√d) · H_d · D · v        inverse  v = (1/√d) · D · H_d · y
// H_d is the Sylvester Hadamard matrix applied as a fast transform (stages h = 1, 2, 4, …, each
// butterfly (a, b) -> (a + b, a - b)); D is the ±1 diagonal drawn from splitmix64 below. Both are
// orthonormal, so the inverse is the same transform in the other order. The operation order is
// part of the byte format: every implementation must add and subtract in exactly this sequence.
#pragma once

#include <cstdint>

#include "base/hd.h"

namespace kvp {

inline constexpr int kMaxHeadDim = 256;

// The float32 constant 1/√d for the supported head dims (d = 64, 128, 256), or 0 for others.
KVP_HD constexpr float InvSqrtHeadDim(int d) {
  return d == 64 ? 0.125f : d == 128 ? 0.0883883476483184405f : d == 256 ? 0.0625f : 0.0f;
}

KVP_HD constexpr uint64_t SplitMix64Next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The diagonal D for head dim d as a bit mask: bit j of words[j / 64] set means sign_j = -1.
struct RotationSigns {
  uint64_t words[kMaxHeadDim / 64];

  KVP_HD bool Negative(int j) const { return (words[j >> 6] >> (j & 63)) & 1u; }
};

KVP_HD constexpr RotationSigns MakeRotationSigns(int d) {
  RotationSigns signs{};
  uint64_t state = 0x6B76706F6F6C0000ull + static_cast<uint64_t>(d);
  for (int j = 0; j < d; ++j) {
    if (SplitMix64Next(state) >> 63) signs.words[j >> 6] |= uint64_t{1} << (j & 63);
  }
  return signs;
}

// In-place unnormalized fast Walsh-Hadamard transform of x[0, d), d a power of two.
template <typename T>
KVP_HD void FastWalshHadamard(T* x, int d) {
  for (int h = 1; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = x[j];
        const T b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// y = (1/√d) · H_d · D · v, in place.
KVP_HD void RotateForward(float* x, int d, const RotationSigns& signs) {
  for (int j = 0; j < d; ++j) {
    if (signs.Negative(j)) x[j] = -x[j];
  }
  FastWalshHadamard(x, d);
  const float inv_sqrt_d = InvSqrtHeadDim(d);
  for (int j = 0; j < d; ++j) x[j] = MulRn(x[j], inv_sqrt_d);
}

// v = (1/√d) · D · H_d · y, in place; T = double gives the references a high-precision inverse.
template <typename T>
KVP_HD void RotateInverse(T* x, int d, const RotationSigns& signs) {
  FastWalshHadamard(x, d);
  const T inv_sqrt_d = static_cast<T>(InvSqrtHeadDim(d));
  for (int j = 0; j < d; ++j) x[j] = signs.Negative(j) ? -(x[j] * inv_sqrt_d) : x[j] * inv_sqrt_d;
}

}  // namespace kvp
