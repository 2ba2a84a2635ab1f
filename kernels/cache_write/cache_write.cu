// Cache write on the GPU. A thread owns an item of kGroups TurboNV groups (16 consecutive elements
// each) of one (token, head). The threads of a head sit in one warp, so the rotation's stages
// across items are xor-shuffles; within a thread the arithmetic is the shared host/device code of
// kvpool/format (E4M3 through the hardware converter, on inputs it encodes as the reference does),
// which is what makes the bytes identical to the CPU reference.
#include <cstdint>

#include "kernels/cache_write/cache_write_launch.h"
#include "kernels/cache_write/index_key_write.cuh"
#include "kernels/capabilities.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/fast_divisor.h"
#include "kernels/common/work_split.h"
#include "kvpool/format/head_codec.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;

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

// The signed Walsh-Hadamard rotation of one head after FlipRotationSigns, kElems elements per
// thread, the head's threads in consecutive lanes (`part`: this thread's place among them). Same
// butterflies, same operands, same order as RotateForward: the stages within a thread first, then
// those across lanes.
template <int kHeadDim, int kElems>
__device__ __forceinline__ void RotateHead(float* x, int part) {
#pragma unroll
  for (int h = 1; h < kElems; h *= 2) {
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
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
  for (int lanes = 1; lanes < kHeadDim / kElems; lanes *= 2) {
    const float own_sign = (part & lanes) != 0 ? -1.0f : 1.0f;
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, x[i], lanes);
      x[i] = __fmaf_rn(x[i], own_sign, other);
    }
  }
  constexpr float kInvSqrt = InvSqrtHeadDim(kHeadDim);
#pragma unroll
  for (int i = 0; i < kElems; ++i) x[i] = MulRn(x[i], kInvSqrt);
}

// The codebook's cells (turbo_code_cells.h) in global memory, copied into each CTA's shared memory.
template <int kBits>
__device__ const TurboCells<kBits> kDeviceTurboCells = MakeTurboCells<kBits>();

// The cells in shared memory, eight copies side by side: copy j of cell c is 16-byte chunk 8c + j,
// and lane l reads copy l % 8. The eight lanes that share a wavefront of a 16-byte load then read
// eight different bank groups whatever their cells (one copy: 12 wavefronts a load instead of 4).
constexpr int kCellCopies = 8;
using SharedCells = TurboCell[kTurboCells][kCellCopies];

// TurboCode and its level from the shared cells: per value the fused multiply-add of
// TurboCellBiased, one LEA (the bias's bits vanish in its shift) and one 16-byte load.
struct SharedTurboCells {
  static constexpr bool kFiniteOnly = true;
  uint32_t base;  // shared address of this lane's copy of cell 0

  __device__ explicit SharedTurboCells(const SharedCells& cells)
      : base(
            static_cast<uint32_t>(__cvta_generic_to_shared(&cells[0][threadIdx.x % kCellCopies]))) {
  }

  __device__ TurboCodeLevel operator()(float u) const {
    static_assert(sizeof(TurboCell) * kCellCopies == 1 << 7);
    const uint32_t address = (__float_as_uint(TurboCellBiased(u)) << 7) + base;
    TurboCell cell;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(cell.boundary), "=f"(cell.level_below), "=f"(cell.level_above),
                   "=r"(cell.code_below)
                 : "r"(address));
    return TurboCodeInCell(cell, u);
  }
};

// Stores the first kBytes bytes of the little-endian words w at dst, which is aligned to the
// largest power of two (up to 16) dividing kBytes: the widest stores that alignment allows.
template <int kBytes>
__device__ __forceinline__ void StoreWords(const uint32_t (&w)[(kBytes + 3) / 4], uint8_t* dst) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; i += 4) {
      reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
    }
  } else if constexpr (kBytes % 8 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; i += 2) {
      reinterpret_cast<uint2*>(dst)[i / 2] = make_uint2(w[i], w[i + 1]);
    }
  } else if constexpr (kBytes % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) reinterpret_cast<uint32_t*>(dst)[i] = w[i];
  } else if constexpr (kBytes % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 2; ++i) {
      reinterpret_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBytes; ++i) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
  }
}

// Encodes kGroups consecutive groups of y and stores their codes at data, one stream of bits
// (group j's at bit 16·N·j), and their scales at scale.
template <int kBits, int kGroups>
__device__ __forceinline__ void StoreTurboGroups(const float* y, float v_scale, uint8_t* data,
                                                 uint8_t* scale, SharedTurboCells cells) {
  constexpr int kGroupBits = kTurboGroupSize * kBits;
  constexpr int kBytes = kGroups * kTurboGroupBytes<kBits>;
  uint32_t stream[(kBytes + 3) / 4] = {};
  uint32_t scales[1] = {0};
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    TurboCodeWords<kBits> codes;
    scales[0] |=
        uint32_t{TurboEncodeGroupCodes<kBits>(y + j * kTurboGroupSize, v_scale, codes, cells)}
        << (8 * j);
    // Group j's words moved to bit kGroupBits·j.
#pragma unroll
    for (int k = 0; k < TurboCodeWords<kBits>::kWords; ++k) {
      AddBitsAt(stream, kGroupBits * j + 32 * k, codes.word[k], 32);
    }
  }
  StoreWords<kBytes>(stream, data);
  StoreWords<kGroups>(scales, scale);
}

// Where slot `slot` lies: its block and its offset in the block (block sizes are powers of two).
struct SlotPlace {
  int64_t block;
  int offset;
};

__device__ __forceinline__ SlotPlace PlaceOfSlot(const LayerCache& c, int64_t slot) {
  return {slot >> (__ffs(c.block_size) - 1), static_cast<int>(slot & (c.block_size - 1))};
}

// One thread's item, kGroups groups of 16 elements of one (token, head), as loaded: K, V and the
// token's slot.
//
// V is the item's own groups (the rotation mixes them), but K, converted element by element, is
// shared out between the two threads of a pair (lanes 2m and 2m + 1: adjacent items of one token
// and head): the pair's 2·kGroups groups alternate between them, so that each of a thread's K
// stores and its partner's cover one run of 32 bytes, which reaches L2 as one sector write instead
// of two halves written by two stores (KGroup; for FP8 K, whose group is 16 bytes).
template <int kGroups>
struct KvItem {
  int head, group;  // group: the item's first group in its head
  int64_t slot;     // -1: skipped, or past the last token
  Bf16x16 k_raw[kGroups], v_raw[kGroups];
};

// The head's group whose K is the thread's j-th (see KvItem): of the pair's 2·kGroups groups, those
// of the thread's parity, j-th first. The pair is two consecutive items whose first is even, and a
// CTA's items start at a multiple of kThreads, so the thread's place in the pair is threadIdx.x's
// parity (which compiles to fewer instructions than the item's). With one group a thread it is the
// item's own.
template <int kGroups>
__device__ __forceinline__ int KGroup(int item_group, int j) {
  return item_group - static_cast<int>(threadIdx.x % 2) * (kGroups - 1) + 2 * j;
}

template <int kHeadDim, int kGroups>
__device__ __forceinline__ KvItem<kGroups> LoadKvItem(const CacheWriteParams& p, uint32_t item,
                                                      FastDivisor heads) {
  constexpr int kItemsPerHead = kHeadDim / (16 * kGroups);
  static_assert(kItemsPerHead % 2 == 0, "the two threads of a pair share a (token, head): KGroup");
  const uint32_t token_head = item / kItemsPerHead;
  const uint32_t token = heads.Divide(token_head);
  KvItem<kGroups> it{static_cast<int>(token_head - token * heads.divisor()),
                     static_cast<int>(item % kItemsPerHead) * kGroups,
                     -1,
                     {},
                     {}};
  // The slot, K and V are loaded together: one memory latency, not three in a row. (K and V of a
  // skipped slot are read for nothing; skipped slots are rare.)
  if (token < p.num_tokens) {
    const int64_t src = int64_t{token_head} * kHeadDim + it.group * 16;
    it.slot = p.slot_mapping[token];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      it.k_raw[j] = LoadBf16x16(p.k + src + 16 * (KGroup<kGroups>(it.group, j) - it.group));
      it.v_raw[j] = LoadBf16x16(p.v + src + 16 * j);
    }
  }
  return it;
}

template <int kGroups>
__device__ __forceinline__ void WriteK(const LayerCache& c, const KvItem<kGroups>& it) {
  if (it.slot < 0) return;
  const SlotPlace at = PlaceOfSlot(c, it.slot);
  uint8_t* k_row = c.K(at.block, at.offset, it.head);
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
    float x[16];
    Unpack(it.k_raw[j], x);
    const int group = KGroup<kGroups>(it.group, j);
    if (c.k_codec.format == KvFormat::kFp8E4m3) {
      StoreE4m3x16(x, c.k_codec.scale, 1.0f, k_row + group * 16);
    } else {
      StoreBf16x16(x, k_row + group * 32);
    }
  }
}

template <int kHeadDim, int kVBits, int kGroups>
__device__ __forceinline__ void WriteV(const LayerCache& c, KvItem<kGroups>& it,
                                       const SharedCells& cells) {
  const SlotPlace at = PlaceOfSlot(c, it.slot);
  float x[16 * kGroups];
  // Every lane joins the rotation's shuffles (a lane past the last token with zeros); only live
  // slots store.
  if constexpr (kVBits == 16) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      Unpack(it.v_raw[j], x + 16 * j);
      if (it.slot >= 0) {
        StoreBf16x16(x + 16 * j, c.VData(at.block, at.offset, it.head) + (it.group + j) * 32);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      if (c.v_codec.rotate) FlipRotationSigns(it.v_raw[j], it.group + j, c.v_codec.signs);
      Unpack(it.v_raw[j], x + 16 * j);
    }
    if (c.v_codec.rotate) RotateHead<kHeadDim, 16 * kGroups>(x, it.group / kGroups);
    if (it.slot >= 0) {
      StoreTurboGroups<kVBits, kGroups>(
          x, c.v_codec.scale,
          c.VData(at.block, at.offset, it.head) + it.group * kTurboGroupBytes<kVBits>,
          c.VScale(at.block, at.offset, it.head) + it.group, SharedTurboCells(cells));
    }
  }
}

// CTAs an SM (64 registers a thread).
constexpr int kCtasPerSm = 4;

// kVBits: 2/3/4 for turboN, 16 for bf16 values. kGroups: the 16-element groups of a thread's item,
// all loaded before the first is computed (Launch says when two pay off).
// Items are numbered in 32 bits; block sizes are powers of two.
template <int kHeadDim, int kVBits, int kGroups>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    CacheWriteKernel(CacheWriteParams p, int kv_blocks, FastDivisor heads) {
  // Launched as a dependent (Launch): the next kernel's CTAs may take this grid's SMs as they free,
  // and this one reads nothing before the kernel before it has completed.
  LetDependentsLaunch();
  WaitForPredecessor();
  const LayerCache& c = p.cache;
  if (static_cast<int>(blockIdx.x) >= kv_blocks) {
    WriteIndexKeys(c, p.index_k, p.slot_mapping, p.num_tokens,
                   (blockIdx.x - kv_blocks) * kThreads + threadIdx.x);
    return;
  }

  KvItem<kGroups> it = LoadKvItem<kHeadDim, kGroups>(p, blockIdx.x * kThreads + threadIdx.x, heads);
  // The cells are copied while K and V are on their way (the indexer's CTAs returned above, so the
  // whole CTA is here), by loads that L1 caches: every CTA reads the same 1 KB, and copies that
  // bypass L1 (cp.async.cg) made the write five times slower.
  __shared__ SharedCells cells;
  if constexpr (kVBits != 16) {
    constexpr int kCopies = kTurboCells * kCellCopies;
    static_assert(kCopies % kThreads == 0);
#pragma unroll
    for (int r = 0; r < kCopies / kThreads; ++r) {
      const int i = r * kThreads + threadIdx.x;
      cells[i / kCellCopies][i % kCellCopies] = kDeviceTurboCells<kVBits>.cell[i / kCellCopies];
    }
    __syncthreads();
  }
  WriteK(c, it);
  WriteV<kHeadDim, kVBits>(c, it, cells);
}

template <int kHeadDim, int kVBits>
LaunchStatus Launch(const CacheWriteParams& p, cudaStream_t stream) {
  const int64_t kv_groups = p.num_tokens * p.cache.num_kv_heads * (kHeadDim / 16);
  // Two groups a thread where the CTAs come in waves: both groups' loads are in flight together,
  // and the two share the slot, the row addresses and one stage of the rotation (faster than one
  // group, or two groups of different tokens, a thread: bench/NOTES.md, cache write). A write that
  // fits the GPU at once (a decode step's tokens) takes one, so that no thread's chain of work is
  // twice as long.
  const int groups = kv_groups > int64_t{SmCount()} * kCtasPerSm * kThreads ? 2 : 1;
  const int64_t kv_blocks = (kv_groups / groups + kThreads - 1) / kThreads;
  const int64_t index_blocks =
      p.cache.has_indexer ? (p.num_tokens * kIndexThreads + kThreads - 1) / kThreads : 0;
  if (kv_blocks + index_blocks == 0) return {};
  if ((kv_blocks + index_blocks) * kThreads > UINT32_MAX) {
    return Unsupported("cache writes of 2^32 or more items (split the tokens)");
  }
  const FastDivisor heads(static_cast<uint32_t>(p.cache.num_kv_heads));
  // A dependent launch: writes of several layers in a row start each one's CTAs during the tail of
  // the one before instead of after it.
  const dim3 grid(static_cast<unsigned>(kv_blocks + index_blocks));
  auto* kernel =
      groups == 2 ? CacheWriteKernel<kHeadDim, kVBits, 2> : CacheWriteKernel<kHeadDim, kVBits, 1>;
  return LaunchStatus{LaunchDependent(kernel, grid, dim3(kThreads), 0, stream, false, p,
                                      static_cast<int>(kv_blocks), heads),
                      nullptr};
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
  // What the switches instantiate, as kernels/capabilities.h declares it to workers.
  constexpr OpCapabilities kServed = kCudaCapabilities.cache_write;
  if (!kServed.k_formats.Has(p.cache.k_codec.format)) return Unsupported("this K format");
  if (!kServed.v_formats.Has(p.cache.v_codec.format)) return Unsupported("this V format");
  if (!kServed.HasHeadDim(p.cache.head_dim)) return Unsupported("this head_dim");
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
