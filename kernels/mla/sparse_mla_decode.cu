// Sparse MLA decode on the tensor cores (kernels/mla/mla_params.h): the plan of the split, the
// merge of the splits, and the mma.sync kernel for heads that are not a multiple of 64 (16 and 32,
// what tensor parallelism over 8 or 4 GPUs leaves a GPU); multiples of 64 go to the warpgroup
// kernel of sparse_mla_decode_wgmma.cu.
//
// A CTA of this kernel takes one query row (sequence, query token), up to 32 of its heads (two
// tiles of 16; other multiples of 16 take more CTAs) and a run of 64-token tiles of its top-k.
// Per tile:
//   1. the tokens' 656-byte entries arrive by cp.async (gathered by slot; -1 slots fill zeros)
//      while the tiles before are computed (two or three tiles ahead: fewer heads leave shared
//      memory for more), and are dequantized once into shared memory as bf16 [64 tokens, 576]
//      for all the CTA's heads;
//   2. S = q · Kᵀ by m16n8k16 bf16 mma: each of the first 4 or 8 warps takes 16 tokens (w % 4) of
//      one head tile (w / 4), the queries staying in shared memory, while the other warps issue
//      the gather of the tile kStages ahead (so the multiplying warps do not wait for it);
//   3. the online softmax across the four token groups goes through shared memory (tile maxima,
//      then P as bf16 [heads, 64] and row sums);
//   4. O += P · V by mma with V the latent part of the same tile: warp w owns output dims
//      [32w, 32w + 32) of every head tile (its 64 float accumulators).
// When the rows and head groups are too few to fill the GPU, the top-k is split across CTAs
// (ChooseSplits) that write normalized partial outputs and log-sum-exps, merged by a second
// kernel. K and P are rounded to bf16 before the mma, as FlashMLA does; sums are float.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/fast_divisor.h"
#include "kernels/common/log2_domain.h"
#include "kernels/common/mma.cuh"
#include "kernels/common/work_split.h"
#include "kernels/mla/mla_dequant.cuh"
#include "kernels/mla/mla_entries.cuh"
#include "kernels/mla/mla_launch.h"
#include "kernels/mla/mla_partials.cuh"
#include "kernels/mla/sparse_mla_decode_wgmma.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

constexpr int kTileTokens = kSparseMlaTileTokens;
constexpr int kThreads = 512;  // 16 warps: four a scheduler to hide the mma and ldmatrix latencies
constexpr int kWarps = kThreads / 32;
constexpr int kHeadTile = 16;
constexpr int kMaxHeadTiles = 2;                      // 32 heads a CTA at most
constexpr int kTokenGroups = 4;                       // of 16 tokens: the QK^T split of a tile
// QK^T: warp w takes token group w % 4 of head tile w / 4; warps 4 kTiles and up gather.
static_assert(kMaxHeadTiles * kTokenGroups < kWarps);
// PV: warp w owns output dims [w · kDimsPerWarp, (w + 1) · kDimsPerWarp) of every head tile.
constexpr int kDimsPerWarp = kMlaLatentDim / kWarps;
constexpr int kDimTiles = kDimsPerWarp / 8;

// Rows padded by 16 bytes: the eight rows an ldmatrix reads fall in eight different bank groups.
constexpr int kRowElems = kMlaInputDim + 8;  // 584
constexpr int kPRowElems = kTileTokens + 8;  // 72
constexpr int kRowChunks = kMlaInputDim / 8;  // 16-byte chunks of a bf16 row: 72
constexpr int kTokenChunks = kMlaTokenBytes / 16;  // 41 cp.async of a cache entry
constexpr int kMaxSplits = 64;

// kTiles head tiles a CTA; kStages tiles' entries in flight (what shared memory leaves room for:
// fewer heads, smaller queries, more tiles ahead to hide the gather's latency).
template <int kTiles, int kStages>
struct Shared {
  static constexpr int kHeads = kTiles * kHeadTile;
  uint16_t q[kHeads][kRowElems];       // the CTA's queries, bf16
  uint16_t k[kTileTokens][kRowElems];  // the tile dequantized: latent (also V) then RoPE
  uint16_t p[kHeads][kPRowElems];      // softmax weights of the tile, bf16
  alignas(16) uint8_t raw[kStages][kTileTokens][kMlaTokenBytes];  // coming tiles, as stored
  const uint8_t* src[kStages][kTileTokens];  // where they are; null: an unused slot
  // Which of a tile's tokens have a slot, a bit each, for the tiles in flight and the one being
  // computed (located kStages tiles ahead, so one more than the stages).
  uint32_t used[kStages + 1][kTileTokens / 32];
  float part_max[kTokenGroups][kHeads];
  float part_sum[kTokenGroups][kHeads];
  float m[kHeads];  // running maximum of the scores, log2 domain
  float l[kHeads];  // running sum of exp2(score - m)
};

__device__ __forceinline__ void MmaBf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kTiles, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    SparseMlaDecodeTcKernel(SparseMlaDecodeParams p, FastDivisor block_size, int tiles_per_split,
                            float* part_out, float* part_lse) {
  LetDependentsLaunch();
  WaitForPredecessor();  // the slots (the top-k), and the workspace the kernel before may read
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  using SharedMemory = Shared<kTiles, kStages>;
  SharedMemory& s = *reinterpret_cast<SharedMemory*>(shared_bytes);
  const int row = blockIdx.x;
  const int head0 = blockIdx.y * SharedMemory::kHeads;
  const int head_tiles = min(kTiles, (p.heads - head0) / kHeadTile);
  const int cta_heads = head_tiles * kHeadTile;
  const int split = blockIdx.z, splits = gridDim.z;
  const int num_tiles = (p.topk + kTileTokens - 1) / kTileTokens;
  const int first_tile = split * tiles_per_split;
  const int end_tile = min(num_tiles, first_tile + tiles_per_split);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int32_t* slots = p.slots + int64_t{row} * p.topk;

  // Threads [0, 64) (two whole warps) fetch a tile's slots an iteration before they locate its
  // entries, so that the wait on L2 hides behind a tile's work: where each entry is (a division
  // by the block size fixed at launch) for the tile's stage, read by load_tile after the next
  // barrier, and which tokens are used.
  auto fetch_slot = [&](int tile) {
    const int k = tile * kTileTokens + tid;
    return tid < kTileTokens && tile < end_tile && k < p.topk ? __ldg(slots + k) : -1;
  };
  auto locate_tile = [&](int tile, int32_t slot) {
    if (tid >= kTileTokens) return;
    s.src[(tile - first_tile) % kStages][tid] = mla::EntryOfSlot(p.cache, block_size, slot);
    const uint32_t used = __ballot_sync(~0u, slot >= 0);
    if (lane == 0) s.used[(tile - first_tile) % (kStages + 1)][warp] = used;
  };
  // One cp.async group a tile (an empty one past the end, or for a thread that loads nothing:
  // Wait counts groups). The warps without a part of q · Kᵀ gather, the others go on to multiply.
  constexpr int kLoaders = (kWarps - kTiles * kTokenGroups) * 32;
  const int loader = tid - (kThreads - kLoaders);  // < 0: not a loader
  auto load_tile = [&](int tile) {
    if (tile < end_tile && loader >= 0) {
      const int stage = (tile - first_tile) % kStages;
      for (int i = loader; i < kTileTokens * kTokenChunks; i += kLoaders) {
        const int j = i / kTokenChunks, c = i % kTokenChunks;
        const uint8_t* src = s.src[stage][j];
        cp_async::Copy<16>(&s.raw[stage][j][c * 16], src != nullptr ? src + c * 16 : p.cache.base,
                           src != nullptr ? 16 : 0);
      }
    }
    cp_async::Commit();
  };
  if (tid < SharedMemory::kHeads) {
    s.m[tid] = -INFINITY;
    s.l[tid] = 0.0f;
  }
  // The first tiles' slots are fetched before the queries' copies are issued, which then overlap
  // the wait on L2.
  int32_t first_slots[kStages];
#pragma unroll
  for (int i = 0; i < kStages; ++i) first_slots[i] = fetch_slot(first_tile + i);
  int32_t next_slot = fetch_slot(first_tile + kStages);
  const Bf16* q = p.q + (int64_t{row} * p.heads + head0) * kMlaInputDim;
  for (int i = tid; i < cta_heads * kRowChunks; i += kThreads) {
    const int h = i / kRowChunks, c = i % kRowChunks;
    cp_async::Copy<16>(&s.q[h][c * 8], q + h * kMlaInputDim + c * 8, 16);
  }
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (first_tile + i < end_tile) locate_tile(first_tile + i, first_slots[i]);
  }
  __syncthreads();
  for (int i = 0; i < kStages; ++i) load_tile(first_tile + i);  // the queries join the first

  const int group = warp % kTokenGroups;  // QK^T: tokens [16 group, 16 group + 16)
  const float score_scale = p.softmax_scale * kLog2e;
  float o[kTiles][kDimTiles][4] = {};
  for (int tile = first_tile; tile < end_tile; ++tile) {
    const int stage = (tile - first_tile) % kStages;
    cp_async::Wait<kStages - 1>();
    __syncthreads();  // the tile's entries are here; the last tile's k and p are consumed
    {
      const int j = tid % kTileTokens;
      mla::DequantizeTokenPart<kThreads / kTileTokens>(
          s.raw[stage][j], tid / kTileTokens,
          [&](int c) { return reinterpret_cast<uint4*>(&s.k[j][c * 8]); });
    }
    if (tile + kStages < end_tile) locate_tile(tile + kStages, next_slot);
    next_slot = fetch_slot(tile + kStages + 1);
    __syncthreads();  // k is complete, the stage's raw entries free, the tile after located
    load_tile(tile + kStages);

    // S = q K^T for this warp's 16 tokens of head tile warp / 4, the fragments of step ks + 1
    // loaded while step ks multiplies. Even and odd steps accumulate apart (summed after).
    const int ht0 = warp / kTokenGroups;
    float sc[2][4] = {};
    if (ht0 < head_tiles) {
      float odd[2][4] = {};
      uint32_t b[2][4], a[2][4];
      const uint16_t* k_row = &s.k[16 * group + lane % 8 + (lane / 16) * 8][((lane / 8) % 2) * 8];
      const uint16_t* q_row = &s.q[ht0 * kHeadTile + lane % 16][(lane / 16) * 8];
      mma::LoadMatrices(k_row, b[0]);
      mma::LoadMatrices(q_row, a[0]);
#pragma unroll
      for (int ks = 0; ks < kMlaInputDim / 16; ++ks) {
        const int cur = ks % 2;
        if (ks + 1 < kMlaInputDim / 16) {
          mma::LoadMatrices(k_row + (ks + 1) * 16, b[cur ^ 1]);
          mma::LoadMatrices(q_row + (ks + 1) * 16, a[cur ^ 1]);
        }
        float (&acc)[2][4] = cur == 0 ? sc : odd;
        MmaBf16(acc[0], a[cur], b[cur][0], b[cur][1]);
        MmaBf16(acc[1], a[cur], b[cur][2], b[cur][3]);
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) sc[n][c] += odd[n][c];
      }
    }
    // Scores in the log2 domain; -inf for unused slots. Lane: heads g, g + 8 of a tile; tokens
    // 16 group + 8 n + 2t + {0, 1}.
    const uint32_t* used = s.used[(tile - first_tile) % (kStages + 1)];
    bool valid[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = 16 * group + 8 * n + 2 * t + e;
        valid[n][e] = (used[j / 32] >> (j % 32)) & 1u;
      }
    }
    if (ht0 < head_tiles) {
      const int ht = ht0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float& x = sc[n][c];
          x = valid[n][c % 2] ? x * score_scale : -INFINITY;
          mx[c / 2] = fmaxf(mx[c / 2], x);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
        if (t == 0) s.part_max[group][ht * kHeadTile + g + 8 * r] = mx[r];
      }
    }
    __syncthreads();  // the tile's maxima

    // The new running maximum of a head (every thread that asks computes the same one).
    auto new_max = [&](int h) {
      float m = s.m[h];
#pragma unroll
      for (int j = 0; j < kTokenGroups; ++j) m = fmaxf(m, s.part_max[j][h]);
      return m;
    };
    if (ht0 < head_tiles) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int h = ht0 * kHeadTile + g + 8 * r;
        const float m = new_max(h);
        const float m_use = m == -INFINITY ? 0.0f : m;  // a head with nothing valid yet
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float e0 = exp2f(sc[n][2 * r] - m_use), e1 = exp2f(sc[n][2 * r + 1] - m_use);
          sum += e0 + e1;
          *reinterpret_cast<uint32_t*>(&s.p[h][16 * group + 8 * n + 2 * t]) = mla::PackBf16(e0, e1);
        }
        sum += __shfl_xor_sync(~0u, sum, 1);
        sum += __shfl_xor_sync(~0u, sum, 2);
        if (t == 0) s.part_sum[group][h] = sum;
      }
    }
    // The rescaling of this warp's accumulator rows, from the old maxima (before the update).
    float alpha[kTiles][2];
#pragma unroll
    for (int ht = 0; ht < kTiles; ++ht) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int h = ht * kHeadTile + g + 8 * r;
        if (ht < head_tiles) {
          const float m = new_max(h);
          alpha[ht][r] = exp2f(s.m[h] - (m == -INFINITY ? 0.0f : m));
        }
      }
    }
    __syncthreads();  // p and the row sums are complete; every thread has read the old maxima
    if (tid < cta_heads) {
      const float m = new_max(tid);
      const float a = exp2f(s.m[tid] - (m == -INFINITY ? 0.0f : m));
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kTokenGroups; ++j) sum += s.part_sum[j][tid];
      s.l[tid] = s.l[tid] * a + sum;
      s.m[tid] = m;
    }

    // O = O · alpha + P V over this warp's 64 output dims.
#pragma unroll
    for (int ht = 0; ht < kTiles; ++ht) {
      if (ht >= head_tiles) continue;
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        o[ht][n][0] *= alpha[ht][0];
        o[ht][n][1] *= alpha[ht][0];
        o[ht][n][2] *= alpha[ht][1];
        o[ht][n][3] *= alpha[ht][1];
      }
    }
#pragma unroll
    for (int ks = 0; ks < kTileTokens / 16; ++ks) {
      uint32_t b[kDimTiles / 2][4];
#pragma unroll
      for (int dp = 0; dp < kDimTiles / 2; ++dp) {
        const int k_row = ks * 16 + lane % 8 + ((lane / 8) % 2) * 8;
        mma::LoadMatricesTransposed(
            &s.k[k_row][kDimsPerWarp * warp + 16 * dp + (lane / 16) * 8], b[dp]);
      }
#pragma unroll
      for (int ht = 0; ht < kTiles; ++ht) {
        if (ht >= head_tiles) continue;
        uint32_t a[4];
        mma::LoadMatrices(&s.p[ht * kHeadTile + lane % 16][ks * 16 + (lane / 16) * 8], a);
#pragma unroll
        for (int dp = 0; dp < kDimTiles / 2; ++dp) {
          MmaBf16(o[ht][2 * dp], a, b[dp][0], b[dp][1]);
          MmaBf16(o[ht][2 * dp + 1], a, b[dp][2], b[dp][3]);
        }
      }
    }
  }
  cp_async::Wait<0>();
  __syncthreads();  // the last update of m and l

#pragma unroll
  for (int ht = 0; ht < kTiles; ++ht) {
    if (ht >= head_tiles) continue;
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = ht * kHeadTile + g + 8 * r;
      const float l = s.l[h];
      // l is 0 for a head with nothing valid; NaN (kept) when a chosen token holds NaN.
      inv[r] = l == 0.0f ? 0.0f : 1.0f / l;
      lse[r] = l == 0.0f ? -INFINITY : (s.m[h] + log2f(l)) * kLn2;
    }
    // Heads h and h + 8 are rows at and at + 8; o[ht][n][2r + e] is dim 32 warp + 8n + 2t + e.
    const int64_t at = int64_t{row} * p.heads + head0 + ht * kHeadTile + g;
    const int dim = kDimsPerWarp * warp + 2 * t;
    if (part_out == nullptr) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        Bf16* out = p.out + (at + 8 * r) * kMlaLatentDim + dim;
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          *reinterpret_cast<uint32_t*>(out + 8 * n) =
              mla::PackBf16(o[ht][n][2 * r] * inv[r], o[ht][n][2 * r + 1] * inv[r]);
        }
        if (warp == 0 && t == 0) p.lse[at + 8 * r] = lse[r];
      }
    } else {
      const float scale = mla::StoresUpperRow(t) ? inv[0] : inv[1];
      float* out = mla::PartialStores(part_out, at, splits, split, dim, t);
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        const float4 v = mla::SwapRowPairs(t, make_float2(o[ht][n][0], o[ht][n][1]),
                                           make_float2(o[ht][n][2], o[ht][n][3]));
        *reinterpret_cast<float4*>(out + 8 * n) = mla::Scaled(v, scale);
      }
      if (warp == 0 && t == 0) {
        part_lse[at * splits + split] = lse[0];
        part_lse[(at + 8) * splits + split] = lse[1];
      }
    }
  }
}

// Merges the splits of one (row, head): out = Σ exp(lse_s - lse) · out_s, lse = ln Σ exp(lse_s).
// 128 · groups threads, each of a group's 128 taking 4 of the 512 dims: group g sums splits g,
// g + groups, ... with eight loads in flight, the first eight issued before the weights are known
// (the two waits on L2 overlap), and the groups' sums meet in shared memory. Every warp finds the
// weights itself from all splits' lse (two a lane, reduced by shuffles) and hands each split's to
// its lanes by a broadcast shuffle.
constexpr int kCombineGroups = 4;
constexpr int kCombineColumns = kMlaLatentDim / 4;  // threads of a group

__global__ void __launch_bounds__(kCombineColumns * kCombineGroups)
    CombineSplitsKernel(SparseMlaDecodeParams p, int splits, const float* part_out,
                        const float* part_lse) {
  LetDependentsLaunch();
  WaitForPredecessor();  // the partial results
  static_assert(kMaxSplits == 64, "two splits a lane of one warp");
  const int64_t at = blockIdx.x;  // row · heads + head
  const int groups = blockDim.x / kCombineColumns;
  const int group = threadIdx.x / kCombineColumns, column = threadIdx.x % kCombineColumns;
  const int lane = threadIdx.x % 32;
  const float* part = part_out + at * splits * kMlaLatentDim + 4 * column;
  constexpr int kBatch = 8;  // loads in flight: one at a time would pay L2's latency per split
  float4 x[kBatch];
  auto load = [&](int first) {
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int split = first + j * groups;
      x[j] = split < splits ? *reinterpret_cast<const float4*>(part + split * kMlaLatentDim)
                            : make_float4(0, 0, 0, 0);
    }
  };
  load(group);

  const float* lse = part_lse + at * splits;
  const float a = lane < splits ? lse[lane] : -INFINITY;
  const float b = lane + 32 < splits ? lse[lane + 32] : -INFINITY;
  float top = fmaxf(a, b);
  for (int o = 16; o > 0; o /= 2) top = fmaxf(top, __shfl_xor_sync(~0u, top, o));
  // top is -inf when no split saw a valid slot.
  const float ea = top == -INFINITY ? 0.0f : expf(a - top);
  const float eb = top == -INFINITY ? 0.0f : expf(b - top);
  float sum = ea + eb;
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(~0u, sum, o);
  // sum is 0 when no split saw a valid slot, NaN (kept) when one's lse is NaN.
  const float wa = sum == 0.0f ? 0.0f : ea / sum, wb = sum == 0.0f ? 0.0f : eb / sum;

  float4 acc = make_float4(0, 0, 0, 0);
  for (int first = group; first < splits; first += groups * kBatch) {
    if (first != group) load(first);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int split = first + j * groups;  // the same in the whole warp
      float w = __shfl_sync(~0u, split & 32 ? wb : wa, split & 31);
      if (split >= splits) w = 0.0f;  // beyond the last split x is 0 (w may be anything)
      // A split without valid slots has weight 0 and outputs 0.
      acc.x += w * x[j].x;
      acc.y += w * x[j].y;
      acc.z += w * x[j].z;
      acc.w += w * x[j].w;
    }
  }
  __shared__ float4 group_sums[kCombineGroups - 1][kCombineColumns];
  if (group > 0) group_sums[group - 1][column] = acc;
  __syncthreads();
  if (group > 0) return;
  for (int g = 1; g < groups; ++g) {
    const float4 y = group_sums[g - 1][column];
    acc.x += y.x;
    acc.y += y.y;
    acc.z += y.z;
    acc.w += y.w;
  }
  uint2 packed = make_uint2(mla::PackBf16(acc.x, acc.y), mla::PackBf16(acc.z, acc.w));
  *reinterpret_cast<uint2*>(p.out + at * kMlaLatentDim + 4 * column) = packed;
  if (threadIdx.x == 0) p.lse[at] = sum == 0.0f ? -INFINITY : top + logf(sum);
}

struct Plan {
  bool wgmma = false;  // heads a multiple of 64: the warpgroup kernel, 64 heads a CTA
  int head_tiles = 0;  // otherwise a CTA's: 1 (16 heads, three tiles in flight) or 2 (32, two)
  int head_ctas = 0, num_tiles = 0, splits = 1, tiles_per_split = 0;
};

Plan PlanOf(const SparseMlaDecodeParams& p) {
  Plan plan;
  plan.wgmma = p.heads % kWgmmaMlaHeads == 0;
  plan.head_tiles = p.heads <= kHeadTile ? 1 : kMaxHeadTiles;
  const int cta_heads = plan.wgmma ? kWgmmaMlaHeads : plan.head_tiles * kHeadTile;
  plan.head_ctas = (p.heads + cta_heads - 1) / cta_heads;
  plan.num_tiles = (p.topk + kTileTokens - 1) / kTileTokens;
  const int rows = p.batch * p.s_q;
  plan.splits =
      plan.num_tiles <= 1 ? 1 : ChooseSplits(rows * plan.head_ctas, plan.num_tiles, SmCount());
  plan.splits = std::min(plan.splits, kMaxSplits);
  if (p.max_splits > 0) plan.splits = std::min(plan.splits, p.max_splits);
  plan.tiles_per_split = (plan.num_tiles + plan.splits - 1) / plan.splits;
  if (plan.tiles_per_split > 0) {
    plan.splits = (plan.num_tiles + plan.tiles_per_split - 1) / plan.tiles_per_split;
  }
  return plan;
}

// Launches the kernel for kTiles head tiles with kStages tiles in flight; its shared memory is
// allowed once per variant.
template <int kTiles, int kStages>
cudaError_t LaunchDecode(dim3 grid, const SparseMlaDecodeParams& p, const Plan& plan,
                         float* part_out, float* part_lse, cudaStream_t stream) {
  constexpr size_t kBytes = sizeof(Shared<kTiles, kStages>);
  static_assert(kBytes <= 227 * 1024, "more shared memory than an H200 CTA may have");
  static const cudaError_t configured =
      cudaFuncSetAttribute(SparseMlaDecodeTcKernel<kTiles, kStages>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  if (configured != cudaSuccess) return configured;
  return LaunchDependent(SparseMlaDecodeTcKernel<kTiles, kStages>, grid, dim3(kThreads), kBytes,
                         stream, false, p, FastDivisor(static_cast<uint32_t>(p.cache.block_size)),
                         plan.tiles_per_split, part_out, part_lse);
}

}  // namespace

size_t SparseMlaDecodeWorkspaceBytes(const SparseMlaDecodeParams& p) {
  if (p.batch <= 0 || p.heads <= 0) return 0;
  const Plan plan = PlanOf(p);
  if (plan.splits <= 1) return 0;
  return size_t(p.batch) * p.s_q * p.heads * plan.splits * (kMlaLatentDim + 1) * sizeof(float);
}

LaunchStatus SparseMlaDecodeLaunch(const SparseMlaDecodeParams& p, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  if (p.heads % kHeadTile != 0 || p.heads <= 0) {
    return Unsupported("sparse MLA decode heads not a multiple of 16");
  }
  if (p.batch <= 0) return {};
  if (p.cache.block_size <= 0) return Unsupported("sparse MLA decode of a layer without blocks");
  const Plan plan = PlanOf(p);
  const int rows = p.batch * p.s_q;
  float* part_out = nullptr;
  float* part_lse = nullptr;
  if (plan.splits > 1) {
    if (workspace_bytes < SparseMlaDecodeWorkspaceBytes(p)) {
      return Unsupported("a sparse MLA decode workspace smaller than it needs");
    }
    part_out = static_cast<float*>(workspace);
    part_lse = part_out + size_t(rows) * p.heads * plan.splits * kMlaLatentDim;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(plan.head_ctas),
                  static_cast<unsigned>(plan.splits));
  const cudaError_t launched =
      plan.wgmma ? LaunchSparseMlaDecodeWgmma(p, plan.splits, plan.tiles_per_split, part_out,
                                              part_lse, stream)
      : plan.head_tiles == 1
          ? LaunchDecode<1, 3>(grid, p, plan, part_out, part_lse, stream)
          : LaunchDecode<kMaxHeadTiles, 2>(grid, p, plan, part_out, part_lse, stream);
  if (launched != cudaSuccess) return LaunchStatus{launched, nullptr};
  if (plan.splits > 1) {
    const cudaError_t combined =
        LaunchDependent(CombineSplitsKernel, dim3(static_cast<unsigned>(rows * p.heads)),
                        dim3(kCombineColumns * std::min(plan.splits, kCombineGroups)), 0, stream,
                        false, p, plan.splits,
                        static_cast<const float*>(part_out), static_cast<const float*>(part_lse));
    if (combined != cudaSuccess) return LaunchStatus{combined, nullptr};
  }
  return {};
}

}  // namespace kvp
