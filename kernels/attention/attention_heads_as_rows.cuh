// The attention kernel for many q heads per kv head (more than 8, e.g. 16): a warp's 16 q heads
// are the rows of its mma fragments. When CTAs of several head tiles fill the GPU (32 or more q
// heads a kv head, and enough sequences), attention_heads_as_rows_decoded.cuh serves instead; it
// shares this file's tile softmax, the warp's view of its head tile and the end of the CTA.
//
// Per 16-position tile a warp computes S = Q·Kᵀ (two m16n8k16 per 16 dims; thread t reads 32
// contiguous K bytes of a row into B fragments), the online softmax on S in the C fragments, and
// O += P·V where P's A fragments are S's C fragments (no shuffles) and V is dequantized into B
// fragments: thread g decodes dims [g·D/8, (g+1)·D/8) of 4 positions, which for D = 128 is exactly
// TurboNV group g. Accumulation stays in the rotated domain.
#pragma once

#include "kernels/attention/attention_pipeline.cuh"

namespace kvp::attention {

// The online softmax of one warp's 16 heads over 8·kEighths positions (16, 32 or 64). s[h] holds
// S = Q·Kᵀ (unscaled) for positions 8h.. as a C fragment: s[h][0..1] = (head g, positions
// 8h + 2t, + 1), s[h][2..3] = head g + 8. Masked positions (slot -1) get no weight; rows 0/1 say
// whether heads g and g + 8 are real. Folds the positions into the running maximum m and sum l
// (rows g, g + 8), rescales acc, and writes P as the A fragments of P·V, one per 16 positions.
// Returns false when sparse-V skips their values (SkipsValues).
template <int kEighths, int kFragments>
__device__ __forceinline__ bool TileSoftmax(const float (&s)[kEighths][4], const int32_t* slots,
                                            float qk_scale, bool row0, bool row1, float tau,
                                            uint32_t* skipped_tiles, float (&m)[2], float (&l)[2],
                                            float (&acc)[kFragments][4],
                                            uint32_t (&pa)[kEighths / 2][4]) {
  static_assert(kEighths % 2 == 0);
  const int t = threadIdx.x % 4;
  float sc[kEighths][4];
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int h = 0; h < kEighths; ++h) {
    const bool v0 = slots[h * 8 + 2 * t] >= 0;
    const bool v1 = slots[h * 8 + 2 * t + 1] >= 0;
    sc[h][0] = v0 ? s[h][0] * qk_scale : -INFINITY;
    sc[h][1] = v1 ? s[h][1] * qk_scale : -INFINITY;
    sc[h][2] = v0 ? s[h][2] * qk_scale : -INFINITY;
    sc[h][3] = v1 ? s[h][3] * qk_scale : -INFINITY;
    tile_max[0] = fmaxf(tile_max[0], fmaxf(sc[h][0], sc[h][1]));
    tile_max[1] = fmaxf(tile_max[1], fmaxf(sc[h][2], sc[h][3]));
  }
  float factor[2], m_use[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 2));
    factor[r] = FoldTileMax(m[r], tile_max[r], &m_use[r]);
  }
  float pr[kEighths][4];
  bool needed = false;
  l[0] *= factor[0];
  l[1] *= factor[1];
#pragma unroll
  for (int h = 0; h < kEighths; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      pr[h][i] = Exp2Ftz(sc[h][i] - m_use[i / 2]);
      needed |= (i < 2 ? row0 : row1) && pr[h][i] > tau;
    }
    l[0] = l[0] + pr[h][0] + pr[h][1];
    l[1] = l[1] + pr[h][2] + pr[h][3];
  }
  RescaleIfMaxMoved(acc, {factor[0], factor[0], factor[1], factor[1]});  // rows g, g + 8
  if (SkipsValues(tau, needed, skipped_tiles, kEighths / 2)) return false;
#pragma unroll
  for (int k = 0; k < kEighths / 2; ++k) {
    pa[k][0] = mma::PackHalf2(pr[2 * k][0], pr[2 * k][1]);
    pa[k][1] = mma::PackHalf2(pr[2 * k][2], pr[2 * k][3]);
    pa[k][2] = mma::PackHalf2(pr[2 * k + 1][0], pr[2 * k + 1][1]);
    pa[k][3] = mma::PackHalf2(pr[2 * k + 1][2], pr[2 * k + 1][3]);
  }
  return true;
}

// Head tiles of 16; a CTA takes up to 4 of them.
inline Plan HeadsAsRowsPlan(const AttentionParams& p) {
  Plan plan;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  plan.head_tiles = (group + 15) / 16;
  plan.tiles_per_cta = plan.head_tiles >= 4 ? 4 : (plan.head_tiles >= 2 ? 2 : 1);
  return plan;
}

// Which q heads a warp of a heads-as-rows CTA holds (the rows of its fragments) and which of a
// chunk's 16-position tiles it takes. The grid is (split, kv head x its CTAs, sequence).
struct HeadTileOfWarp {
  int seq = 0, kv_head = 0, group = 0;
  int first_local = 0;     // the CTA's first q head within its kv head
  int sub = 0;             // the warp takes tiles sub, sub + warps_per_tile, ... of each chunk
  int warps_per_tile = 1;  // warps sharing the head tile
  bool real = false;       // the head tile exists (a CTA's last may be padding)
  bool row0 = false, row1 = false;  // heads of rows g, g + 8 exist
  int64_t q_head0 = 0;              // row g's q head in p.q (row g + 8: q_head0 + 8)

  __device__ static HeadTileOfWarp Of(const AttentionParams& p, const Plan& plan, int warp) {
    HeadTileOfWarp w;
    const int g = threadIdx.x % 32 / 4;
    const int ctas_per_kv = plan.ctas_per_kv_head();
    w.seq = blockIdx.z;
    w.kv_head = blockIdx.y / ctas_per_kv;
    w.group = p.num_q_heads / p.cache.num_kv_heads;
    w.first_local = (blockIdx.y % ctas_per_kv) * plan.tiles_per_cta * 16;
    w.warps_per_tile = plan.warps_per_head_tile();
    w.sub = warp % w.warps_per_tile;
    const int head_tile = w.first_local / 16 + warp / w.warps_per_tile;
    const int local0 = head_tile * 16 + g;
    w.real = head_tile < plan.head_tiles;
    w.row0 = w.real && local0 < w.group;
    w.row1 = w.real && local0 + 8 < w.group;
    w.q_head0 = int64_t{w.seq} * p.num_q_heads + w.kv_head * w.group + local0;
    return w;
  }
};

// Shared memory a heads-as-rows CTA needs to write its heads' outputs itself: the merge rows,
// then the normalized outputs of its heads (16 a warp at most).
template <int kHeadDim>
inline constexpr int kFinishOutputsBytes = kMergeBytes<kHeadDim> + kWarps * 16 * kHeadDim * 4;

// After the last chunk: finishes each row's sum across its quad, then merges the warps of each
// head tile through shared memory (the stages, ring and level pairs are free now) into one part
// per CTA: fewer parts for the combining kernel to read. dim_of(j, n) is the dim of column n of
// the accumulators' n-tile j. kMayFinish: when the CTA is its heads' only part, it writes their
// outputs itself instead (the launch then skips the combining kernel; the kernel's shared memory
// holds kFinishOutputsBytes).
template <int kHeadDim, int kNTiles, bool kMayFinish, class DimOf>
__device__ __forceinline__ void FinishHeadTiles(const AttentionParams& p, const Plan& plan,
                                                const HeadTileOfWarp& w, const float (&m)[2],
                                                float (&l)[2], const float (&acc)[kNTiles][4],
                                                DimOf&& dim_of, uint8_t* smem, float* parts) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
  constexpr int kRow = kRowFloats<kHeadDim>;
  static_assert(kWarps * 16 * kRow * 4 <= kMergeBytes<kHeadDim>);
  float* merge = reinterpret_cast<float*>(smem);  // [warp][row 0..15][kRow]
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* row = merge + (warp * 16 + g + 8 * r) * kRow;
    if (t == 0) {
      row[0] = m[r];
      row[1] = l[r];
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      row[kAccOffset + dim_of(j, 2 * t)] = acc[j][2 * r];
      row[kAccOffset + dim_of(j, 2 * t + 1)] = acc[j][2 * r + 1];
    }
  }
  __syncthreads();
  const int64_t kv_q_head = int64_t{w.seq} * p.num_q_heads + w.kv_head * w.group;
  if constexpr (kMayFinish) {
    if (plan.parts() == 1) {
      WriteOutputs<kHeadDim, 16>(merge, plan.tiles_per_cta, w.warps_per_tile, w.first_local,
                                 w.group, merge + kWarps * 16 * kRow, p, kv_q_head);
      return;
    }
  }
  WriteParts<kHeadDim, 16>(merge, plan.tiles_per_cta, w.warps_per_tile, w.first_local, w.group,
                           parts, kv_q_head, plan.parts(), blockIdx.x);
}

// Where a warp keeps its 16 heads' Q fragments (32 registers for D = 128): in registers the
// kernel takes 167 registers, so three CTAs fit an SM; in shared memory (read once per k-step of
// each tile) 128, so four fit. Throughput-bound launches, whose CTAs take many chunks, gain from
// the fourth CTA; latency-bound ones, a chunk or two a CTA, lose the time of those reads; four
// CTAs with the fragments in registers spill (bench/NOTES.md, other dense decode shapes).
inline constexpr int kSharedQueriesCtasPerSm = 4;
inline constexpr int kMinChunksForSharedQueries = 4;  // a CTA's chunks, for shared-memory queries
template <int kHeadDim>
inline constexpr int kQueryFragmentBytes = (kHeadDim / 16) * 32 * 16 * kWarps;  // [warp][s][lane]
template <int kHeadDim, int kVBits, int kDepth>
inline constexpr int kQueryFragmentsOffset =
    kPairLevelsOffset<kHeadDim, kVBits, 1, kChunk, kDepth> + (4 << (2 * kVBits));
template <int kHeadDim, int kVBits, int kDepth>
inline constexpr int kSharedQueriesBytes =
    SharedBytesOf(kQueryFragmentsOffset<kHeadDim, kVBits, kDepth> + kQueryFragmentBytes<kHeadDim>,
                  kMergeBytes<kHeadDim>);
// The heads-as-rows kernel's stages: as deep as four CTAs an SM allow with the queries in shared
// memory (three for turbo2, two for turbo3 and turbo4 at D = 128), kStages otherwise.
template <int kHeadDim, int kVBits, bool kQueriesInShared>
inline constexpr int kRowsDepth =
    !kQueriesInShared ||
            (kSharedQueriesBytes<kHeadDim, kVBits, kStages> + kCtaReservedSharedBytes) *
                    kSharedQueriesCtasPerSm <=
                kSmSharedBytes
        ? kStages
        : 2;
template <int kHeadDim, int kVBits, bool kQueriesInShared>
inline constexpr int kRowsSharedBytes =
    kQueriesInShared ? kSharedQueriesBytes<kHeadDim, kVBits, kRowsDepth<kHeadDim, kVBits, true>>
                     : kSharedBytes<kHeadDim, kVBits, 1>;

// The heads-as-rows kernels' body (HeadsAsRowsKernel, HeadsAsRowsSharedQueriesKernel below).
template <int kHeadDim, int kVBits, bool kSparse, bool kQueriesInShared>
__device__ __forceinline__ void HeadsAsRows(const AttentionParams& p, const PositionSource& src,
                                            const Plan& plan, float* parts) {
  using St = Stage<kHeadDim, kVBits, 1>;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  constexpr int kNTiles = kHeadDim / 8;  // n-tiles of P·V; also V dims per thread
  constexpr int kDepth = kRowsDepth<kHeadDim, kVBits, kQueriesInShared>;
  extern __shared__ __align__(16) uint8_t smem[];
  const __half2* pair_levels = StartPartsKernel<kHeadDim, kVBits, 1, kChunk, kDepth>(smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const HeadTileOfWarp w = HeadTileOfWarp::Of(p, plan, warp);

  // Q fragments of this warp's 16 heads (rows g and g + 8), dims permuted as in mma.cuh. Loaded
  // here, converted once the first chunks' copies are issued.
  uint2 q_loaded[kSteps][2];
  {
    const uint16_t* q0 = reinterpret_cast<const uint16_t*>(p.q) + w.q_head0 * kHeadDim;
    const uint16_t* q1 = q0 + 8 * kHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int d = t * (kHeadDim / 4) + 4 * s;
      q_loaded[s][0] = w.row0 ? mma::LoadBf16x4(q0 + d) : uint2{0u, 0u};
      q_loaded[s][1] = w.row1 ? mma::LoadBf16x4(q1 + d) : uint2{0u, 0u};
    }
  }
  // The A fragments of k-step s: in registers (qa[s]), or in shared memory, where lane l of
  // warp w holds them at [w][s][l] (each lane reads back only its own).
  uint32_t qa[kQueriesInShared ? 1 : kSteps][4];
  uint4* q_shared =
      reinterpret_cast<uint4*>(smem + kQueryFragmentsOffset<kHeadDim, kVBits, kDepth>) +
      warp * kSteps * 32 + lane;
  auto convert_queries = [&] {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if constexpr (kQueriesInShared) {
        uint4 a;
        mma::Bf16x4ToHalf2x2(q_loaded[s][0], &a.x, &a.z);
        mma::Bf16x4ToHalf2x2(q_loaded[s][1], &a.y, &a.w);
        q_shared[s * 32] = a;
      } else {
        mma::Bf16x4ToHalf2x2(q_loaded[s][0], &qa[s][0], &qa[s][2]);
        mma::Bf16x4ToHalf2x2(q_loaded[s][1], &qa[s][1], &qa[s][3]);
      }
    }
  };
  // c += Q·Kᵀ of k-step s, with B fragments b0, b1 (the fragment read once for both tokens' halves:
  // the loop below runs over k-steps, then halves).
  auto mma_with_queries = [&](float* c, int s, uint32_t b0, uint32_t b1) {
    if constexpr (kQueriesInShared) {
      const uint4 f = q_shared[s * 32];
      const uint32_t a[4] = {f.x, f.y, f.z, f.w};
      mma::MmaF16(c, a, b0, b1);
    } else {
      mma::MmaF16(c, qa[s], b0, b1);
    }
  };
  const float qk_scale = p.softmax_scale * p.cache.k_codec.scale * kLog2e;
  const float tau = p.sparse_v_threshold;

  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // this thread's share of the running sum
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  ChunkStream<kHeadDim, kVBits, kSparse, 1, kChunk, kDepth> stream(p, src, plan.splits, blockIdx.x,
                                                                   w.seq, w.kv_head, smem);
  stream.ForEach(convert_queries, [&](const St& st) {
    if (!w.real) return;
    for (int tile = w.sub; tile < St::kPositions / kTile; tile += w.warps_per_tile) {
      const int base = tile * kTile;
      // S = Q·Kᵀ for tokens g (half 0) and 8 + g (half 1).
      // Two accumulators per half (even and odd k-steps) halve the dependent mma chain.
      float s_acc[2][4], s_odd[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[h][i] = s_odd[h][i] = 0.0f;
      }
#pragma unroll
      for (int s = 0; s < kSteps; s += 4) {
        uint32_t kw[2][4];  // K bytes of tokens g, 8 + g for k-steps s .. s + 3
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 k16 = *reinterpret_cast<const uint4*>(
              st.k + St::KByte(base, h * 8 + g, t * (kHeadDim / 4) + 4 * s));
          kw[h][0] = k16.x, kw[h][1] = k16.y, kw[h][2] = k16.z, kw[h][3] = k16.w;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t b0, b1;
            mma::E4m3x4ToHalf2x2(kw[h][q], &b0, &b1);
            mma_with_queries(q % 2 ? s_odd[h] : s_acc[h], s + q, b0, b1);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[h][i] += s_odd[h][i];
      }
      uint32_t pa[1][4];
      if (!TileSoftmax(s_acc, st.slots + base, qk_scale, w.row0, w.row1, tau, p.skipped_tiles, m, l,
                       acc, pa)) {
        continue;
      }
      // V of tokens 2t, 2t + 1 (B rows k = 0, 1) and 8 + 2t, 9 + 2t (k = 8, 9), dims [g·D/8,
      // (g+1)·D/8).
      uint32_t vb[2][kNTiles];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = base + half * 8 + 2 * t;
        DecodeValuePair<kHeadDim, kVBits>(st.v + i * St::kVRow, st.s + i * St::kSRow, St::kVRow,
                                          St::kSRow, g, pair_levels, vb[half]);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) mma::MmaF16(acc[j], pa[0], vb[0][j], vb[1][j]);
    }
  });

  // B column n of n-tile j is dim n·D/8 + j.
  FinishHeadTiles<kHeadDim, kNTiles, false>(
      p, plan, w, m, l, acc, [](int j, int n) { return n * kNTiles + j; }, smem, parts);
}

template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32)
    HeadsAsRowsKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  HeadsAsRows<kHeadDim, kVBits, kSparse, false>(p, src, plan, parts);
}

template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32, kSharedQueriesCtasPerSm)
    HeadsAsRowsSharedQueriesKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  HeadsAsRows<kHeadDim, kVBits, kSparse, true>(p, src, plan, parts);
}

}  // namespace kvp::attention
