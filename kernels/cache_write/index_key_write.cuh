// The indexer keys' cache write on the GPU, shared by the K/V cache write and the MLA cache write
// (the index section is the same in both pool kinds), with the bf16 loading and E4M3 storing
// helpers it is built from. Bytes identical to EncodeHead with the indexer codec. CUDA only.
#pragma once

#include <cstdint>

#include "kvpool/format/head_codec.h"
#include "kvpool/format/indexer_quant.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp {

// 16 bf16 values as they come from memory; unpacked once they are needed, so loads of a thread
// can all be in flight together.
struct Bf16x16 {
  uint4 a, b;
};

__device__ __forceinline__ Bf16x16 LoadBf16x16(const Bf16* src) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  return {s[0], s[1]};
}

__device__ __forceinline__ void Unpack(const Bf16x16& raw, float* x) {
  const uint32_t w[8] = {raw.a.x, raw.a.y, raw.a.z, raw.a.w, raw.b.x, raw.b.y, raw.b.z, raw.b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// E4m3FromFloat of 16 values: the converter on all of them, then, in the rare thread that has a
// NaN (the only input that becomes 0x7F or 0xFF), the NaN's sign that the converter dropped.
// kBf16Values: every value is a bf16 value (E4m3x2FromBf16Values).
template <bool kBf16Values>
__device__ __forceinline__ uint4 E4m3x16(const float* v) {
  uint32_t w[4];
  uint32_t nan_bytes = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBf16Values) {
      w[i] = E4m3x2FromBf16Values(v[4 * i], v[4 * i + 1]) |
             (E4m3x2FromBf16Values(v[4 * i + 2], v[4 * i + 3]) << 16);
    } else {
      w[i] = E4m3x2FromFloat(v[4 * i], v[4 * i + 1]) |
             (E4m3x2FromFloat(v[4 * i + 2], v[4 * i + 3]) << 16);
    }
    // A byte whose low seven bits are all ones becomes 0x80 here, no other byte reaches it.
    nan_bytes |= (w[i] & 0x7F7F7F7Fu) + 0x01010101u;
  }
  if (nan_bytes & 0x80808080u) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int shift = 8 * (i % 4);
      if (isnan(v[i])) {
        w[i / 4] = (w[i / 4] & ~(0xFFu << shift)) | (uint32_t{E4m3FromFloat(v[i])} << shift);
      }
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 16 bf16 values as E4M3(x · multiplier) or E4M3(x / divisor): one of the two is 1.
__device__ __forceinline__ void StoreE4m3x16(const float* x, float divisor, float multiplier,
                                             uint8_t* dst) {
  // x / 1 == x and x · 1 == x exactly, so skipping either keeps the reference's bytes (and the
  // values bf16 values); NaN skips the arithmetic too, which would drop its sign. The choice is one
  // per call, not per value.
  if (divisor == 1.0f && multiplier == 1.0f) {
    *reinterpret_cast<uint4*>(dst) = E4m3x16<true>(x);
    return;
  }
  float v[16];
  if (divisor != 1.0f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = isnan(x[i]) ? x[i] : DivRn(x[i], divisor);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = isnan(x[i]) ? x[i] : MulRn(x[i], multiplier);
  }
  *reinterpret_cast<uint4*>(dst) = E4m3x16<false>(v);
}

// Indexer keys: eight threads a token, one group of 16 elements each; the scale is the token's,
// from the amax reduced across its threads. (Two groups a thread, half the CTAs, measured slower:
// bench/NOTES.md, cache write.)
constexpr int kIndexThreads = kIndexHeadDim / 16;

__device__ __forceinline__ void WriteIndexKeys(const LayerCache& c, const Bf16* index_k,
                                               const int64_t* slots, int64_t num_tokens,
                                               uint32_t item) {
  const int64_t token = item / kIndexThreads;
  const int group = static_cast<int>(item % kIndexThreads);
  const bool live = token < num_tokens;
  const int64_t slot = live ? slots[token] : -1;
  // Kept as loaded (8 registers, not 16) while the amax is reduced, unpacked again to store: the
  // whole kernel's registers are allocated together, and the fewer this path holds the better
  // (one unpacking measured slower).
  Bf16x16 raw = {};
  if (live) raw = LoadBf16x16(index_k + token * kIndexHeadDim + group * 16);
  float a = kIndexerMinAmax;
  {
    float x[16];
    Unpack(raw, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) a = MaxAbs(x[i], a);
  }
#pragma unroll
  for (int lanes = 1; lanes < kIndexThreads; lanes *= 2) {
    a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, lanes));
  }
  float s = DivRn(a, kE4m3Max);
  if (c.index_codec.ue8m0) s = RoundUpToUe8m0(s);
  if (slot < 0) return;
  // Any block size (MLA kernels are tested with sizes that are not powers of two).
  const int64_t block = slot / c.block_size;
  const int offset = static_cast<int>(slot % c.block_size);
  uint8_t* dst = c.IndexValues(block, offset) + group * 16;
  float x[16];
  Unpack(raw, x);
  // A UE8M0 scale is a power of two, so dividing by it is multiplying by its exact reciprocal.
  if (c.index_codec.ue8m0) {
    StoreE4m3x16(x, 1.0f, DivRn(1.0f, s), dst);
  } else {
    StoreE4m3x16(x, s, 1.0f, dst);
  }
  if (group == 0) *reinterpret_cast<float*>(c.IndexScale(block, offset)) = s;
}

}  // namespace kvp
