// Tensor-core helpers for the attention kernels (sm_80+ mma.sync, f16 inputs, f32 accumulators).
// Fragment layouts of m16n8k16 (PTX ISA), with g = lane / 4 and t = lane % 4:
//   A (16x16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C (16x8):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// The k index of a dot product may be permuted freely as long as A and B agree: the kernels give
// thread t the contiguous dims [t·D/4, (t+1)·D/4) of a row, so its K bytes come in 16-byte loads.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kvp::mma {

__device__ __forceinline__ void MmaF16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 matrices of 16-bit elements from shared memory (ldmatrix): lane l gives the address
// of row l % 8 of matrix l / 8 (16 contiguous bytes) and receives x[i] = row l / 4, columns
// 2(l % 4), 2(l % 4) + 1 of matrix i: a B fragment half of m16n8k16 when a matrix's rows are the
// n index and its columns the k index.
__device__ __forceinline__ void LoadMatrices(const void* row, uint32_t (&x)[4]) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(address));
}

// The same, each matrix transposed: x[i] = column l / 4, rows 2(l % 4), 2(l % 4) + 1 of matrix
// i: a B fragment half when a matrix's rows are the k index and its columns the n index.
__device__ __forceinline__ void LoadMatricesTransposed(const void* row, uint32_t (&x)[4]) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(address));
}

// Two E4M3 bytes (low byte = lower k) to two f16, exactly.
__device__ __forceinline__ uint32_t E4m3x2ToHalf2(uint32_t two_bytes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

// Four E4M3 bytes to two f16 pairs, exactly: bytes 0, 1 -> *lo; bytes 2, 3 -> *hi. The hardware
// converter reads either half of a register, so no shift is needed for the upper pair.
__device__ __forceinline__ void E4m3x4ToHalf2x2(uint32_t four_bytes, uint32_t* lo, uint32_t* hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(*lo), "=r"(*hi)
      : "r"(four_bytes));
}

// Transposes an 8x8 matrix of 16-bit elements held as one C-style fragment (lane l: row l / 4,
// columns 2(l % 4), 2(l % 4) + 1): afterwards lane l holds row l / 4 of the transpose.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Two bf16 in one word (the lower element in the low half) as an f16 pair, through float: exact
// for bf16 values inside f16's normal range.
__device__ __forceinline__ uint32_t Bf16x2ToHalf2(uint32_t two) {
  return PackHalf2(__uint_as_float(two << 16), __uint_as_float(two & 0xFFFF0000u));
}

// Four consecutive bf16 at `p` (8-byte aligned), as they are in memory: one 8-byte load instead of
// four 2-byte ones, converted by Bf16x4ToHalf2x2 where the values are needed, so that the load's
// latency is not waited for where they are loaded.
__device__ __forceinline__ uint2 LoadBf16x4(const uint16_t* p) {
  return *reinterpret_cast<const uint2*>(p);
}

// Four bf16 from LoadBf16x4 as two f16 pairs: (p[0], p[1]) and (p[2], p[3]).
__device__ __forceinline__ void Bf16x4ToHalf2x2(uint2 w, uint32_t* first, uint32_t* second) {
  *first = Bf16x2ToHalf2(w.x);
  *second = Bf16x2ToHalf2(w.y);
}

}  // namespace kvp::mma
