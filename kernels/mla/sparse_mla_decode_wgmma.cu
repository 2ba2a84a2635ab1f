// Sparse MLA decode on Hopper's warpgroup tensor cores, for 64 heads a CTA (kernels/mla/
// sparse_mla_decode_wgmma.h).
//
// Two warpgroups share one query row's 64 heads and a run of 64-token tiles of its top-k. Per tile:
//   1. the tokens' 656-byte entries, gathered by cp.async while the tile before was computed (with
//      more than one tile a CTA, by a third warpgroup, handed over on two mbarriers), are
//      dequantized once into shared memory as bf16 [64 tokens, 576] in the 128-byte swizzle;
//   2. S = Q · Kᵀ by wgmma with both operands in shared memory: warpgroup w scores tokens
//      [32w, 32w + 32) for all 64 heads (m64n32k16, 36 steps over the 576 dims);
//   3. the two halves' row maxima meet in shared memory; each warpgroup writes its P = exp2(S - m)
//      as bf16 into a shared [64 heads, 64 tokens] tile and rescales its accumulator;
//   4. O += P · V by wgmma, V the latent part of the same shared tile read N-major: warpgroup w
//      owns output dims [256w, 256w + 256) (m64n256k16, 128 accumulators a thread).
// The queries stay in shared memory (both warpgroups read all of them), the running maximum is
// the same in both warpgroups, and each sums its own tokens' weights; the sums meet at the end.
// K, V and P are rounded to bf16 for the tensor cores, as in the mma.sync kernel and FlashMLA.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/fast_divisor.h"
#include "kernels/common/log2_domain.h"
#include "kernels/common/wgmma.cuh"
#include "kernels/mla/mla_dequant.cuh"
#include "kernels/mla/mla_entries.cuh"
#include "kernels/mla/mla_partials.cuh"
#include "kernels/mla/sparse_mla_decode_wgmma.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

constexpr int kTileTokens = kSparseMlaTileTokens;
constexpr int kHeads = kWgmmaMlaHeads;  // a CTA's: the M of every wgmma
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;  // the consumers: they dequantize and multiply
// With more than one tile a CTA, a third warpgroup gathers each next tile's entries, so that the
// consumers do not issue its copies. Registers a thread, moved between the warpgroups by
// setmaxnreg within what a launch of 384 threads allots the CTA (65,536 / 384, rounded down to a
// multiple of 8: 168 a thread).
constexpr int kGatherThreads = 128;
constexpr int kConsumerRegisters = 232, kGatherRegisters = 40;
static_assert(kThreads * kConsumerRegisters + kGatherThreads * kGatherRegisters <=
              (kThreads + kGatherThreads) * 168);
constexpr int kConsumerBarrier = 1, kGatherBarrier = 2;  // named barriers (0: all threads)
constexpr int LaunchThreads(bool gatherers) { return kThreads + (gatherers ? kGatherThreads : 0); }

__device__ __forceinline__ void SyncThreads(int barrier, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(threads) : "memory");
}
constexpr int kTokensPerGroup = kTileTokens / kWarpgroups;  // the N of the QK^T wgmma
constexpr int kDimsPerGroup = kMlaLatentDim / kWarpgroups;  // the N of the PV wgmma
constexpr int kRowBytes = wgmma::kSwizzleRowBytes;          // 64 bf16: one swizzled row
constexpr int kColumns = kMlaInputDim * 2 / kRowBytes;      // 9 column blocks of 64 dims
constexpr int kColumnBytes = kTileTokens * kRowBytes;       // one block of a 64-row tile
constexpr int kRowChunks = kMlaInputDim / 8;                // 16-byte chunks of a bf16 row
constexpr int kTokenChunks = kMlaTokenBytes / 16;           // cp.async of a cache entry
static_assert(kHeads == kTileTokens, "q and k tiles share one shape of column blocks");
static_assert(kMlaInputDim * 2 % kRowBytes == 0 && kDimsPerGroup % 64 == 0);

// A [64 rows, 576 dims] bf16 tile as nine column blocks of 64 dims, each block 64 rows of 128
// bytes in the 128-byte swizzle: K-major for the QK^T operands, N-major (rows are k) for V.
struct alignas(wgmma::kSwizzleAtomBytes) SwizzledTile {
  uint8_t bytes[kColumns][kColumnBytes];
};

// Where the 16-byte chunk `chunk` (0..71) of row `row` lives in a SwizzledTile.
__device__ __forceinline__ int ChunkOffset(int row, int chunk) {
  return (chunk / 8) * kColumnBytes + wgmma::Swizzled128(row, (chunk % 8) * 16);
}

struct Shared {
  SwizzledTile q;  // the CTA's 64 heads
  SwizzledTile k;  // the tile: latent (also V) then RoPE
  alignas(wgmma::kSwizzleAtomBytes) uint8_t p[kHeads * kRowBytes];  // weights, [heads, tokens]
  alignas(16) uint8_t raw[kTileTokens][kMlaTokenBytes];             // the next tile, as stored
  const uint8_t* src[kTileTokens];  // where it is; null: an unused slot
  // Which tokens have a slot, a bit each, for this tile and the next (located a tile ahead).
  uint32_t used[2][kTileTokens / 32];
  float part_max[kWarpgroups][kHeads];
  float part_sum[kWarpgroups][kHeads];
  uint64_t full;   // with gatherers, a phase a tile: its entries have landed in raw
  uint64_t empty;  // with gatherers, a phase a tile: the consumers have dequantized raw
};
constexpr size_t kSharedBytes = sizeof(Shared) + wgmma::kSwizzleAtomBytes;  // room to align
static_assert(kSharedBytes <= 227 * 1024, "more shared memory than an H200 CTA may have");

template <bool kGatherers>
__global__ void __launch_bounds__(LaunchThreads(kGatherers), 1)
    SparseMlaDecodeWgmmaKernel(SparseMlaDecodeParams p, FastDivisor block_size, int head_ctas,
                               int tiles_per_split, float* part_out, float* part_lse) {
  LetDependentsLaunch();
  WaitForPredecessor();  // the slots (the top-k), and the workspace the kernel before may read
  extern __shared__ uint8_t shared_bytes[];
  const uint32_t misalignment =
      static_cast<uint32_t>(__cvta_generic_to_shared(shared_bytes)) % wgmma::kSwizzleAtomBytes;
  Shared& s = *reinterpret_cast<Shared*>(
      shared_bytes + (misalignment == 0 ? 0 : wgmma::kSwizzleAtomBytes - misalignment));
  // The head CTAs of a row are neighbours in launch order: the second reads the row's entries
  // from L2.
  const int row = blockIdx.x / head_ctas;
  const int head0 = (blockIdx.x % head_ctas) * kHeads;
  const int split = blockIdx.y, splits = gridDim.y;
  const int num_tiles = (p.topk + kTileTokens - 1) / kTileTokens;
  const int first_tile = split * tiles_per_split;
  const int end_tile = min(num_tiles, first_tile + tiles_per_split);
  const int tid = threadIdx.x, group = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int32_t* slots = p.slots + int64_t{row} * p.topk;

  // A tile's slots are fetched a tile before they are used, so that the wait on L2 hides behind a
  // tile's work: by threads [0, 64) of the consumers (which tokens are used) and of the gatherers
  // (where each entry is: a division by the block size fixed at launch). `i`: the thread's index
  // in its warpgroups.
  auto fetch_slot = [&](int tile, int i) {
    const int k = tile * kTileTokens + i;
    return i < kTileTokens && tile < end_tile && k < p.topk ? __ldg(slots + k) : -1;
  };
  auto entry_of = [&](int32_t slot) { return mla::EntryOfSlot(p.cache, block_size, slot); };
  auto mark_used = [&](int tile, int32_t slot) {  // consumer threads [0, 64)
    if (tid >= kTileTokens || tile >= end_tile) return;
    const uint32_t used = __ballot_sync(~0u, slot >= 0);
    if (lane == 0) s.used[(tile - first_tile) % 2][tid / 32] = used;
  };
  auto gather = [&](int first, int stride) {  // the located tile's copies into raw
    for (int i = first; i < kTileTokens * kTokenChunks; i += stride) {
      const int j = i / kTokenChunks, c = i % kTokenChunks;
      const uint8_t* src = s.src[j];
      cp_async::Copy<16>(&s.raw[j][c * 16], src != nullptr ? src + c * 16 : p.cache.base,
                         src != nullptr ? 16 : 0);
    }
  };

  // The first tile's slots are fetched before the queries' copies are issued, which then overlap
  // the wait on L2 (at batch 1 a CTA has a single tile, so this wait is on its critical path).
  const int32_t first_slot = fetch_slot(first_tile, tid);
  int32_t next_slot = fetch_slot(first_tile + 1, tid);
  if (kGatherers && tid == 0) {
    bulk::Init(&s.full, kGatherThreads);
    bulk::Init(&s.empty, kThreads / 32);
    bulk::FenceInit();
  }
  const Bf16* q = p.q + (int64_t{row} * p.heads + head0) * kMlaInputDim;
  for (int i = tid; i < kHeads * kRowChunks && tid < kThreads; i += kThreads) {
    const int h = i / kRowChunks, c = i % kRowChunks;
    cp_async::Copy<16>(s.q.bytes[0] + ChunkOffset(h, c), q + h * kMlaInputDim + c * 8, 16);
  }
  if (tid < kTileTokens && first_tile < end_tile) s.src[tid] = entry_of(first_slot);
  mark_used(first_tile, first_slot);
  __syncthreads();  // the barriers are initialized, the first tile located
  if constexpr (!kGatherers) {
    if (first_tile < end_tile) gather(tid, kThreads);
  } else if (tid >= kThreads) {  // the gatherers: every tile's copies
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kGatherRegisters));
    const int gid = tid - kThreads;
    if (first_tile < end_tile) gather(gid, kGatherThreads);
    cp_async::ArriveWhenLanded(&s.full);
    int32_t slot = fetch_slot(first_tile + 1, gid);
    for (int tile = first_tile + 1; tile < end_tile; ++tile) {
      const int32_t next = fetch_slot(tile + 1, gid);
      bulk::Wait(&s.empty, (tile - first_tile - 1) & 1);  // the consumers are done with raw
      if (gid < kTileTokens) s.src[gid] = entry_of(slot);
      SyncThreads(kGatherBarrier, kGatherThreads);  // the tile located
      gather(gid, kGatherThreads);
      cp_async::ArriveWhenLanded(&s.full);
      slot = next;
    }
    cp_async::Wait<0>();
    return;
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  }
  cp_async::Commit();  // the queries (without gatherers, with the first tile)

  // This thread's accumulator rows (the same in both warpgroups): heads h0 and h0 + 8.
  const int h0 = 16 * warp + g;
  float m[2] = {-INFINITY, -INFINITY};  // running maxima of the scores, log2 domain
  float l[2] = {0.0f, 0.0f};            // running sums of this warpgroup's exp2(score - m)
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  const float score_scale = p.softmax_scale * kLog2e;
  const uint64_t q_desc = wgmma::SwizzledKMajorDescriptor(s.q.bytes[0]);
  const uint64_t k_desc =
      wgmma::SwizzledKMajorDescriptor(s.k.bytes[0] + kTokensPerGroup * group * kRowBytes);
  const uint64_t p_desc = wgmma::SwizzledKMajorDescriptor(s.p);
  const uint64_t v_desc =
      wgmma::SwizzledMnMajorDescriptor(s.k.bytes[kDimsPerGroup / 64 * group], kColumnBytes);

  for (int tile = first_tile; tile < end_tile; ++tile) {
    cp_async::Wait<0>();  // the queries; without gatherers, the tile's entries
    if constexpr (kGatherers) bulk::Wait(&s.full, (tile - first_tile) & 1);
    SyncThreads(kConsumerBarrier, kThreads);  // the tile is here; k and p are consumed
    {
      const int j = tid % kTileTokens;
      mla::DequantizeTokenPart<kThreads / kTileTokens>(s.raw[j], tid / kTileTokens, [&](int c) {
        return reinterpret_cast<uint4*>(s.k.bytes[0] + ChunkOffset(j, c));
      });
    }
    if constexpr (kGatherers) {
      __syncwarp();
      if (lane == 0) bulk::ArriveExpectingBytes(&s.empty, 0);  // raw is free for the next tile
    } else if (tid < kTileTokens && tile + 1 < end_tile) {
      s.src[tid] = entry_of(next_slot);
    }
    wgmma::FenceSharedWrites();
    mark_used(tile + 1, next_slot);
    next_slot = fetch_slot(tile + 2, tid);
    SyncThreads(kConsumerBarrier, kThreads);  // k is complete; the next tile located
    if constexpr (!kGatherers) {
      if (tile + 1 < end_tile) gather(tid, kThreads);  // raw is free
      cp_async::Commit();
    }

    // S = Q K^T over this warpgroup's 32 tokens: 36 k-steps of 16 dims (32 bytes of a row).
    float sc[16];
    wgmma::Fence();
#pragma unroll
    for (int ks = 0; ks < kMlaInputDim / 16; ++ks) {
      const int offset = (ks / 4) * kColumnBytes + (ks % 4) * 32;
      wgmma::MmaM64N32K16Bf16(sc, wgmma::AdvancedDescriptor(q_desc, offset),
                              wgmma::AdvancedDescriptor(k_desc, offset), ks > 0);
    }
    wgmma::Commit();
    // While the tensor cores work: which of this thread's tokens count. Lane: tokens
    // 32 group + 8j + 2t + {0, 1}, j = 0..3.
    const uint32_t used = s.used[(tile - first_tile) % 2][group];  // this warpgroup's tokens
    bool valid[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) valid[i] = (used >> (8 * (i / 2) + 2 * t + i % 2)) & 1u;
    wgmma::Wait<0>();
    wgmma::KeepAfterWait(sc);

    // sc[4j + e] is head h0, token 8j + 2t + e; sc[4j + 2 + e] head h0 + 8, the same token.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int r = (i / 2) % 2, token = 2 * (i / 4) + i % 2;
      sc[i] = valid[token] ? sc[i] * score_scale : -INFINITY;
      mx[r] = fmaxf(mx[r], sc[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
      if (t == 0) s.part_max[group][h0 + 8 * r] = mx[r];
    }
    SyncThreads(kConsumerBarrier, kThreads);  // both halves' maxima

    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = h0 + 8 * r;
      const float m_new = fmaxf(m[r], fmaxf(s.part_max[0][h], s.part_max[1][h]));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a head with nothing valid yet
      alpha[r] = exp2f(m[r] - m_use);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float e0 = exp2f(sc[4 * j + 2 * r] - m_use);
        const float e1 = exp2f(sc[4 * j + 2 * r + 1] - m_use);
        sum += e0 + e1;
        const int token = kTokensPerGroup * group + 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(s.p + wgmma::Swizzled128(h, 2 * token)) =
            mla::PackBf16(e0, e1);
      }
      sum += __shfl_xor_sync(~0u, sum, 1);
      sum += __shfl_xor_sync(~0u, sum, 2);
      l[r] = l[r] * alpha[r] + sum;
    }
    wgmma::FenceSharedWrites();
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i / 2) % 2];
    SyncThreads(kConsumerBarrier, kThreads);  // P is complete

    // O += P V over this warpgroup's 256 dims: 4 k-steps of 16 tokens (16 rows of each block).
    wgmma::Fence();
#pragma unroll
    for (int ks = 0; ks < kTileTokens / 16; ++ks) {
      wgmma::MmaM64N256K16Bf16NMajorB(o, wgmma::AdvancedDescriptor(p_desc, ks * 32),
                                      wgmma::AdvancedDescriptor(v_desc, ks * 16 * kRowBytes), true);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::KeepAfterWait(o);
  }
  cp_async::Wait<0>();

  if (t == 0) {
    s.part_sum[group][h0] = l[0];
    s.part_sum[group][h0 + 8] = l[1];
  }
  SyncThreads(kConsumerBarrier, kThreads);
  float inv[2], lse[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = s.part_sum[0][h0 + 8 * r] + s.part_sum[1][h0 + 8 * r];
    // sum is 0 for a head with nothing valid; NaN (kept) when a chosen token holds NaN.
    inv[r] = sum == 0.0f ? 0.0f : 1.0f / sum;
    lse[r] = sum == 0.0f ? -INFINITY : (m[r] + log2f(sum)) * kLn2;
  }
  const int64_t at = int64_t{row} * p.heads + head0 + h0;  // heads h0 and h0 + 8: at, at + 8
  const int dim = kDimsPerGroup * group + 2 * t;
  // o[4j + 2r + e]: head h0 + 8r, dim 256 group + 8j + 2t + e.
  if (part_out == nullptr) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      Bf16* out = p.out + (at + 8 * r) * kMlaLatentDim + dim;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        *reinterpret_cast<uint32_t*>(out + 8 * j) =
            mla::PackBf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      }
      if (group == 0 && t == 0) p.lse[at + 8 * r] = lse[r];
    }
  } else {
    const float scale = mla::StoresUpperRow(t) ? inv[0] : inv[1];
    float* out = mla::PartialStores(part_out, at, splits, split, dim, t);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float4 v = mla::SwapRowPairs(t, make_float2(o[4 * j], o[4 * j + 1]),
                                         make_float2(o[4 * j + 2], o[4 * j + 3]));
      *reinterpret_cast<float4*>(out + 8 * j) = mla::Scaled(v, scale);
    }
    if (group == 0 && t == 0) {
      part_lse[at * splits + split] = lse[0];
      part_lse[(at + 8) * splits + split] = lse[1];
    }
  }
}

// Launches the variant with or without gatherers; its shared memory is allowed once per variant.
template <bool kGatherers>
cudaError_t LaunchVariant(dim3 grid, const SparseMlaDecodeParams& p, int head_ctas,
                          int tiles_per_split, float* part_out, float* part_lse,
                          cudaStream_t stream) {
  static const cudaError_t configured =
      cudaFuncSetAttribute(SparseMlaDecodeWgmmaKernel<kGatherers>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSharedBytes));
  if (configured != cudaSuccess) return configured;
  return LaunchDependent(SparseMlaDecodeWgmmaKernel<kGatherers>, grid,
                         dim3(LaunchThreads(kGatherers)), kSharedBytes, stream, false, p,
                         FastDivisor(static_cast<uint32_t>(p.cache.block_size)), head_ctas,
                         tiles_per_split, part_out, part_lse);
}

}  // namespace

cudaError_t LaunchSparseMlaDecodeWgmma(const SparseMlaDecodeParams& p, int splits,
                                       int tiles_per_split, float* part_out, float* part_lse,
                                       cudaStream_t stream) {
  const int head_ctas = p.heads / kHeads;
  const dim3 grid(static_cast<unsigned>(p.batch * p.s_q * head_ctas),
                  static_cast<unsigned>(splits));
  // A CTA of one tile has no next tile to gather: its consumers gather it (at batch 1 the
  // gatherers' launch and register handover measured 0.4 us slower).
  return tiles_per_split > 1
             ? LaunchVariant<true>(grid, p, head_ctas, tiles_per_split, part_out, part_lse, stream)
             : LaunchVariant<false>(grid, p, head_ctas, tiles_per_split, part_out, part_lse,
                                    stream);
}

}  // namespace kvp
