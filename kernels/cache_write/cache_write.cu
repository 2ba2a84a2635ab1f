// Cache write on the GPU. One thread owns 16 consecutive elements of one (token, head): a TurboNV
// group. The D/16 threads of a head sit in one warp, so the cross-group stages of the rotation are
// xor-shuffles; within a thread the arithmetic is the shared host/device code of kvpool/format
// (E4M3 through the hardware converter, on inputs it encodes as the reference does), which is what
// makes the bytes identical to the CPU reference.
#include <cstdint>

#include "kernels/cache_write/cache_write_launch.h"
#include "kernels/common/fast_divisor.h"
#include "kvpool/format/head_codec.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;

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

__device__ __forceinline__ void StoreBf16x16(const float* x, uint8_t* dst) {
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    w[i] = Bf16FromFloat(x[2 * i]).bits | (uint32_t{Bf16FromFloat(x[2 * i + 1]).bits} << 16);
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(w[0], w[1], w[2], w[3]);
  d[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// E4m3FromFloat of 16 values: the converter on all of them, then, in the rare thread that has a
// NaN (the only input that becomes 0x7F or 0xFF), the NaN's sign that the converter dropped.
__device__ __forceinline__ uint4 E4m3x16(const float* v) {
  uint32_t w[4];
  uint32_t nan_bytes = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = E4m3x2FromFloat(v[4 * i], v[4 * i + 1]) |
           (E4m3x2FromFloat(v[4 * i + 2], v[4 * i + 3]) << 16);
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

// 16 values as E4M3(x · multiplier) or E4M3(x / divisor): one of the two is 1.
__device__ __forceinline__ void StoreE4m3x16(const float* x, float divisor, float multiplier,
                                             uint8_t* dst) {
  // x / 1 == x and x · 1 == x exactly, so skipping either keeps the reference's bytes; NaN skips
  // the arithmetic too, which would drop its sign. The choice is one per call, not per value.
  float v[16];
  if (divisor != 1.0f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = isnan(x[i]) ? x[i] : DivRn(x[i], divisor);
  } else if (multiplier != 1.0f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = isnan(x[i]) ? x[i] : MulRn(x[i], multiplier);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = x[i];
  }
  *reinterpret_cast<uint4*>(dst) = E4m3x16(v);
}

// The sign flips that start the rotation, on one group's 16 values while they are still packed
// bf16 pairs (value 2i in the low half of word i): negating is flipping a sign bit, whatever the
// width. The group's 16 signs come from one word (a group never straddles two 64-bit words); the
// odd ones are moved up by 15 so that one shift brings the signs of a pair to bits 15 and 31.
__device__ __forceinline__ void FlipRotationSigns(Bf16x16& raw, int group,
                                                  const RotationSigns& signs) {
  const uint32_t negative = static_cast<uint32_t>(signs.words[group / 4] >> (16 * (group % 4)));
  const uint32_t spread = (negative & 0x5555u) | ((negative & 0xAAAAu) << 15);
  uint32_t* w = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] ^= (spread << (15 - 2 * i)) & 0x80008000u;
}

// The signed Walsh-Hadamard rotation of one head after FlipRotationSigns, 16 elements per thread,
// kGroups threads per head in consecutive lanes. Same butterflies, same operands, same order as
// RotateForward.
template <int kGroups>
__device__ __forceinline__ void RotateHead(float* x, int group) {
#pragma unroll
  for (int h = 1; h < 16; h *= 2) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if ((i & h) == 0) {
        const float a = x[i], b = x[i + h];
        x[i] = AddRn(a, b);
        x[i + h] = SubRn(a, b);
      }
    }
  }
  // Across lanes the lower lane of a pair keeps a + b and the upper one a - b: x·(±1) + other
  // in one fused operation is exactly that sum or difference (multiplying by ±1 is exact, so the
  // single rounding is the addition's), without computing both and selecting.
#pragma unroll
  for (int lanes = 1; lanes < kGroups; lanes *= 2) {
    const float own_sign = (group & lanes) != 0 ? -1.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, x[i], lanes);
      x[i] = __fmaf_rn(x[i], own_sign, other);
    }
  }
  constexpr float kInvSqrt = InvSqrtHeadDim(kGroups * 16);
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] = MulRn(x[i], kInvSqrt);
}

// TurboLevel from a copy of the codebook in shared memory: one load (the levels sit in distinct
// banks) instead of a tree of selects per value.
struct SharedTurboLevels {
  const float* levels;
  __device__ float operator()(int code) const { return levels[code]; }
};

template <int kBits>
__device__ __forceinline__ void StoreTurboGroup(const float* y, float v_scale, uint8_t* data,
                                                uint8_t* scale, SharedTurboLevels levels) {
  uint8_t packed[kTurboGroupBytes<kBits>];
  TurboEncodeGroup<kBits>(y, v_scale, packed, scale, levels);
  if constexpr (kBits == 2) {
    *reinterpret_cast<uint32_t*>(data) =
        packed[0] | (packed[1] << 8) | (packed[2] << 16) | (uint32_t{packed[3]} << 24);
  } else if constexpr (kBits == 3) {
    uint16_t* d = reinterpret_cast<uint16_t*>(data);
#pragma unroll
    for (int i = 0; i < 3; ++i)
      d[i] = static_cast<uint16_t>(packed[2 * i] | (packed[2 * i + 1] << 8));
  } else {
    uint64_t v = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v |= uint64_t{packed[i]} << (8 * i);
    *reinterpret_cast<uint64_t*>(data) = v;
  }
}

// kVBits: 2/3/4 for turboN, 16 for bf16 values.
// Items (one thread's 16 elements) are numbered in 32 bits; block sizes are powers of two.
// Five CTAs an SM (48 registers; turbo3 without spills, turbo4 with 8 bytes): H200, 32,768 tokens
// x 8 layers, 635 -> 620 us against four, in two runs; six (40 registers, spilling) 626; three 676.
template <int kHeadDim, int kVBits>
__global__ void __launch_bounds__(kThreads, 5)
    CacheWriteKernel(CacheWriteParams p, int kv_blocks, FastDivisor heads) {
  constexpr int kGroups = kHeadDim / 16;
  const LayerCache& c = p.cache;
  const int block_shift = __ffs(c.block_size) - 1;
  __shared__ float levels[16];
  if constexpr (kVBits != 16) {
    if (threadIdx.x < (1u << kVBits)) levels[threadIdx.x] = TurboLevel<kVBits>(threadIdx.x);
    __syncthreads();
  }
  if (static_cast<int>(blockIdx.x) >= kv_blocks) {
    // Indexer keys: 8 threads of 16 elements per token.
    const uint32_t item = (blockIdx.x - kv_blocks) * kThreads + threadIdx.x;
    const int64_t token = item / 8;
    const int group = static_cast<int>(item % 8);
    const bool live = token < p.num_tokens;
    const int64_t slot = live ? p.slot_mapping[token] : -1;
    float x[16] = {};
    if (live) Unpack(LoadBf16x16(p.index_k + token * kIndexHeadDim + group * 16), x);
    float a = kIndexerMinAmax;
#pragma unroll
    for (int i = 0; i < 16; ++i) a = MaxAbs(x[i], a);
#pragma unroll
    for (int lanes = 1; lanes < 8; lanes *= 2) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, lanes));
    float s = DivRn(a, kE4m3Max);
    if (c.index_codec.ue8m0) s = RoundUpToUe8m0(s);
    if (slot < 0) return;
    const int64_t block = slot >> block_shift;
    const int offset = static_cast<int>(slot & (c.block_size - 1));
    // A UE8M0 scale is a power of two, so dividing by it is multiplying by its exact reciprocal.
    if (c.index_codec.ue8m0) {
      StoreE4m3x16(x, 1.0f, DivRn(1.0f, s), c.IndexValues(block, offset) + group * 16);
    } else {
      StoreE4m3x16(x, s, 1.0f, c.IndexValues(block, offset) + group * 16);
    }
    if (group == 0) *reinterpret_cast<float*>(c.IndexScale(block, offset)) = s;
    return;
  }

  const uint32_t item = blockIdx.x * kThreads + threadIdx.x;
  const uint32_t token_head = item / kGroups;
  const int group = static_cast<int>(item % kGroups);
  const uint32_t token = heads.Divide(token_head);
  const int head = static_cast<int>(token_head - token * heads.divisor());
  const bool live = token < p.num_tokens;
  const int64_t src = int64_t{token_head} * kHeadDim + group * 16;
  // The slot, K and V are loaded together: one memory latency, not three in a row. (K and V of a
  // skipped slot are read for nothing; skipped slots are rare.)
  int64_t slot = -1;
  Bf16x16 k_raw{}, v_raw{};
  if (live) {
    slot = p.slot_mapping[token];
    k_raw = LoadBf16x16(p.k + src);
    v_raw = LoadBf16x16(p.v + src);
  }
  const int64_t block = slot >> block_shift;
  const int offset = static_cast<int>(slot & (c.block_size - 1));

  float x[16];
  if (slot >= 0) {
    Unpack(k_raw, x);
    uint8_t* k_row = c.K(block, offset, head);
    if (c.k_codec.format == KvFormat::kFp8E4m3) {
      StoreE4m3x16(x, c.k_codec.scale, 1.0f, k_row + group * 16);
    } else {
      StoreBf16x16(x, k_row + group * 32);
    }
  }
  // Every lane joins the rotation's shuffles (a lane past the last token with zeros); only live
  // slots store.
  if constexpr (kVBits == 16) {
    Unpack(v_raw, x);
    if (slot >= 0) StoreBf16x16(x, c.VData(block, offset, head) + group * 32);
  } else {
    if (c.v_codec.rotate) FlipRotationSigns(v_raw, group, c.v_codec.signs);
    Unpack(v_raw, x);
    if (c.v_codec.rotate) RotateHead<kGroups>(x, group);
    if (slot >= 0) {
      StoreTurboGroup<kVBits>(x, c.v_codec.scale,
                              c.VData(block, offset, head) + group * kTurboGroupBytes<kVBits>,
                              c.VScale(block, offset, head) + group, SharedTurboLevels{levels});
    }
  }
}

template <int kHeadDim, int kVBits>
LaunchStatus Launch(const CacheWriteParams& p, cudaStream_t stream) {
  const int64_t kv_items = p.num_tokens * p.cache.num_kv_heads * (kHeadDim / 16);
  const int64_t kv_blocks = (kv_items + kThreads - 1) / kThreads;
  const int64_t index_blocks =
      p.cache.has_indexer ? (p.num_tokens * 8 + kThreads - 1) / kThreads : 0;
  if (kv_blocks + index_blocks == 0) return {};
  if ((kv_blocks + index_blocks) * kThreads > UINT32_MAX) {
    return Unsupported("cache writes of 2^32 or more 16-element items (split the tokens)");
  }
  CacheWriteKernel<kHeadDim, kVBits><<<kv_blocks + index_blocks, kThreads, 0, stream>>>(
      p, static_cast<int>(kv_blocks), FastDivisor(static_cast<uint32_t>(p.cache.num_kv_heads)));
  return LastLaunchError();
}

template <int kHeadDim>
LaunchStatus DispatchValueFormat(const CacheWriteParams& p, cudaStream_t stream) {
  switch (p.cache.v_codec.format) {
    case KvFormat::kTurbo2:
      return Launch<kHeadDim, 2>(p, stream);
    case KvFormat::kTurbo3:
      return Launch<kHeadDim, 3>(p, stream);
    case KvFormat::kTurbo4:
      return Launch<kHeadDim, 4>(p, stream);
    case KvFormat::kBf16:
      return Launch<kHeadDim, 16>(p, stream);
    default:
      return Unsupported("this V format");
  }
}

}  // namespace

LaunchStatus CacheWriteLaunch(const CacheWriteParams& p, cudaStream_t stream) {
  if (p.cache.k_codec.format != KvFormat::kFp8E4m3 && p.cache.k_codec.format != KvFormat::kBf16) {
    return Unsupported("this K format");
  }
  switch (p.cache.head_dim) {
    case 64:
      return DispatchValueFormat<64>(p, stream);
    case 128:
      return DispatchValueFormat<128>(p, stream);
    case 256:
      return DispatchValueFormat<256>(p, stream);
    default:
      return Unsupported("this head_dim");
  }
}

}  // namespace kvp
