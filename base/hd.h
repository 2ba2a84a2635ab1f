// Host/device portability for code shared by the CPU references and the CUDA kernels.
//
// Format arithmetic (E4M3, bf16, TurboNV, indexer quantization, the synthetic generator) lives in
// headers that both g++ and nvcc compile. docs/design.md §3 requires GPU writes to be bit-identical
// to the CPU, so every float operation whose rounding matters goes through MulRn, AddRn, DivRn or
// SqrtRn: on the device they are the explicitly rounded intrinsics (nvcc can never fuse them into
// an FMA), on the host plain operators (the host build uses -ffp-contract=off). Fma is the one
// fused operation the formats use (sums of squares), and it is fused on both sides.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVP_HD __host__ __device__ __forceinline__
#else
#define KVP_HD inline
#endif

namespace kvp {

// std::integral_constant without <type_traits>' host-only callable operator: usable in device code.
template <int kValue>
struct IntConstant {
  KVP_HD constexpr int operator()() const { return kValue; }
  static constexpr int value = kValue;
};

KVP_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KVP_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KVP_HD float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KVP_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

KVP_HD float SqrtRn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

KVP_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

KVP_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

KVP_HD float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

KVP_HD bool IsNan(float x) { return (FloatBits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// max(|a|, b) for a b that is not NaN; a NaN `a`, quiet or signalling, leaves b. The device's
// fmaxf does that for both kinds of NaN; the host's returns NaN for a signalling one (IEEE 754-2008
// maxNum), which would restart a running maximum at the next value, so the host compares instead.
KVP_HD float MaxAbs(float a, float b) {
#if defined(__CUDA_ARCH__)
  return fmaxf(fabsf(a), b);
#else
  return std::fabs(a) > b ? std::fabs(a) : b;
#endif
}

}  // namespace kvp
