// Warpgroup matrix multiply-accumulate (wgmma.mma_async, sm_90a) with the A operand in registers
// and B in shared memory, K-major, in the 128-byte swizzle. A warpgroup is four consecutive warps;
// every wgmma call here must be reached by all 128 of its threads.
//
// Register fragments (PTX ISA, "wgmma .m64nNk16"), g = lane / 4, t = lane % 4, warp w of the group:
//   A (64x16, f16): rows 16w.., the m16n8k16 A fragment of mma.cuh per warp.
//   A (64x32, E4M3): rows 16w..; a0 = (g, k 4t..4t+3), a1 = (g+8, 4t..), a2 = (g, 16+4t..),
//                    a3 = (g+8, 16+4t..), four bytes a register, lower k in the lower byte.
//   D (64xN, f32):  d[4j], d[4j + 1] = row 16w + g, columns 8j + 2t and 8j + 2t + 1;
//                   d[4j + 2], d[4j + 3] = row 16w + g + 8, the same columns.
// B (KxN) lives as N rows of K: row n holds its k values contiguously, 128 bytes (64 f16 or 128
// E4M3) a row in one swizzle atom of 8 rows (1024 bytes, 1024-byte aligned), atoms stacked 1024
// bytes apart; a k-step is 32 bytes of a row either way.
#pragma once

#include <cstdint>

namespace kvp::wgmma {

constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;

// Offset of byte `byte` (0..127) of row `row` in a 128-byte-swizzled tile: the 16-byte pieces of a
// row are permuted by the row's index within its atom, so that eight rows' same piece fall in
// different banks.
__host__ __device__ constexpr int Swizzled128(int row, int byte) {
  return row * kSwizzleRowBytes + (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
}

// Descriptor (PTX ISA "Matrix Descriptor Format") of a K-major operand in the 128-byte swizzle
// whose row 0 of this k-step starts at `at`: a step's offset inside the 128-byte row is added to
// the start address, the hardware swizzles the final address. The tile must be 1024-byte aligned.
__device__ __forceinline__ uint64_t SwizzledKMajorDescriptor(const void* at) {
  const uint64_t address = static_cast<uint32_t>(__cvta_generic_to_shared(at));
  constexpr uint64_t kLeadingBytes = 16;  // unused by swizzled K-major layouts; 1 by convention
  constexpr uint64_t kStrideBytes = kSwizzleAtomBytes;  // from one 8-row atom to the next
  constexpr uint64_t kSwizzle128 = 1;
  return ((address & 0x3FFFF) >> 4) | ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) |
         (kSwizzle128 << 62);
}

// Descriptor of an MN-major operand in the 128-byte swizzle (PTX ISA "Shared Memory Matrix
// Layout", canonical ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))): a row holds 64 consecutive 16-bit
// values of the M or N dimension, eight rows (eight k) make a 1024-byte atom, atoms of the next
// eight k lie kSwizzleAtomBytes on, and the next 64 values of M or N lie `mn_stride_bytes` on.
// Row 0 of the k-step starts at `at`, which is 1024-byte aligned.
__device__ __forceinline__ uint64_t SwizzledMnMajorDescriptor(const void* at, int mn_stride_bytes) {
  const uint64_t address = static_cast<uint32_t>(__cvta_generic_to_shared(at));
  const uint64_t leading_bytes = static_cast<uint64_t>(mn_stride_bytes);
  constexpr uint64_t kStrideBytes = kSwizzleAtomBytes;
  constexpr uint64_t kSwizzle128 = 1;
  return ((address & 0x3FFFF) >> 4) | ((leading_bytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) |
         (kSwizzle128 << 62);
}

// The descriptor of the same operand `bytes` further on (a multiple of 16, staying in shared
// memory): the start address field is the low bits, in 16-byte units. One add, where building a
// new descriptor inside a loop costs about five instructions a call.
__device__ __forceinline__ uint64_t AdvancedDescriptor(uint64_t descriptor, int bytes) {
  return descriptor + static_cast<uint64_t>(bytes >> 4);
}

// Makes this thread's earlier st.shared writes visible to wgmma (which reads shared memory through
// the async proxy); a barrier must still follow before another thread's wgmma reads them.
__device__ __forceinline__ void FenceSharedWrites() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders this thread's earlier register and shared-memory writes before the wgmma that follow.
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler sees a wgmma write its accumulators at issue; this keeps their reads after Wait().
template <int kCount>
__device__ __forceinline__ void KeepAfterWait(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 32 accumulator registers of an m64n64 wgmma as read-write asm operands %0..%31.
#define KVP_WGMMA_ACCUMULATORS_32(d)                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// The 16 accumulator registers of an m64n32 wgmma as read-write asm operands %0..%15.
#define KVP_WGMMA_ACCUMULATORS_16(d)                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])

// d (64x64 f32) = a · B (+ d when `accumulate`), k = 16 f16: a from registers, B by descriptor.
__device__ __forceinline__ void MmaM64N64K16(float (&d)[32], const uint32_t (&a)[4],
                                             uint64_t b_descriptor, bool accumulate) {
  asm volatile(
      "{\n .reg .pred acc;\n setp.ne.u32 acc, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, acc, 1, 1, 0;\n}\n"
      : KVP_WGMMA_ACCUMULATORS_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
        "r"(static_cast<uint32_t>(accumulate)));
}

// d (64x64 f32) = a · B (+ d when `accumulate`), k = 32 E4M3: a from registers, B by descriptor.
// The tensor cores sum FP8 products in about 13 mantissa bits (e4m3_split.h).
__device__ __forceinline__ void MmaM64N64K32E4m3(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t b_descriptor, bool accumulate) {
  asm volatile(
      "{\n .reg .pred acc;\n setp.ne.u32 acc, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, acc, 1, 1;\n}\n"
      : KVP_WGMMA_ACCUMULATORS_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),
        "r"(static_cast<uint32_t>(accumulate)));
}

#undef KVP_WGMMA_ACCUMULATORS_32

// d (64x32 f32) = A · B (+ d when `accumulate`), k = 16 bf16, both operands in shared memory,
// K-major.
__device__ __forceinline__ void MmaM64N32K16Bf16(float (&d)[16], uint64_t a_descriptor,
                                                 uint64_t b_descriptor, bool accumulate) {
  asm volatile(
      "{\n .reg .pred acc;\n setp.ne.u32 acc, %18, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, acc, 1, 1, 0, 0;\n}\n"
      : KVP_WGMMA_ACCUMULATORS_16(d)
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<uint32_t>(accumulate)));
}

// The 128 accumulator registers of an m64n256 wgmma as read-write asm operands %0..%127.
#define KVP_WGMMA_ACCUMULATORS_128(d)                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),                          \
  "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),                        \
  "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),                    \
  "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),                    \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),                    \
  "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),                    \
  "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),                    \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),                    \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),                    \
  "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),                    \
  "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),                    \
  "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),                    \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),                    \
  "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),                    \
  "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),                    \
  "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),                    \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),                  \
  "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),              \
  "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),              \
  "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),              \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),              \
  "+f"(d[126]), "+f"(d[127])

// d (64x256 f32) = A · B (+ d when `accumulate`), k = 16 bf16, both in shared memory: A K-major,
// B N-major (a row of B holds 64 consecutive values of N; SwizzledMnMajorDescriptor).
__device__ __forceinline__ void MmaM64N256K16Bf16NMajorB(float (&d)[128], uint64_t a_descriptor,
                                                         uint64_t b_descriptor, bool accumulate) {
  asm volatile(
      "{\n .reg .pred acc;\n setp.ne.u32 acc, %130, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
      "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, "
      "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
      "%120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, acc, 1, 1, 0, 1;\n}\n"
      : KVP_WGMMA_ACCUMULATORS_128(d)
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<uint32_t>(accumulate)));
}

#undef KVP_WGMMA_ACCUMULATORS_128
#undef KVP_WGMMA_ACCUMULATORS_16

}  // namespace kvp::wgmma
