// The attention kernel for many q heads per kv head (more than 8, e.g. 16 or MLA's 128): a warp's
// 16 q heads are the rows of its mma fragments.
//
// Per 16-position tile a warp computes S = Q·Kᵀ (two m16n8k16 per 16 dims; thread t reads 32
// contiguous K bytes of a row into B fragments), the online softmax on S in the C fragments, and
// O += P·V where P's A fragments are S's C fragments (no shuffles) and V is dequantized into B
// fragments: thread g decodes dims [g·D/8, (g+1)·D/8) of 4 positions, which for D = 128 is exactly
// TurboNV group g. Accumulation stays in the rotated domain.
#pragma once

#include "kernels/common/attention_pipeline.cuh"

namespace kvp::attention {

// Head tiles of 16; a CTA takes up to 4 of them.
inline Plan HeadsAsRowsPlan(const AttentionParams& p) {
  Plan plan;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  plan.head_tiles = (group + 15) / 16;
  plan.tiles_per_cta = plan.head_tiles >= 4 ? 4 : (plan.head_tiles >= 2 ? 2 : 1);
  return plan;
}

template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32)
    HeadsAsRowsKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  using St = Stage<kHeadDim, kVBits, 1>;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  constexpr int kNTiles = kHeadDim / 8;  // n-tiles of P·V; also V dims per thread
  extern __shared__ __align__(16) uint8_t smem[];
  const __half2* pair_levels = StartPartsKernel<kHeadDim, kVBits, 1>(smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int split = blockIdx.x;
  const int ctas_per_kv = plan.ctas_per_kv_head();
  const int kv_head = blockIdx.y / ctas_per_kv;
  const int wpt = plan.warps_per_head_tile();
  const int head_tile = (blockIdx.y % ctas_per_kv) * plan.tiles_per_cta + warp / wpt;
  const int sub = warp % wpt;
  const int seq = blockIdx.z;
  const int group = p.num_q_heads / p.cache.num_kv_heads;

  // Q fragments of this warp's 16 heads (rows g and g + 8), dims permuted as in mma.cuh.
  const int local0 = head_tile * 16 + g, local1 = local0 + 8;
  const bool row0 = head_tile < plan.head_tiles && local0 < group;
  const bool row1 = head_tile < plan.head_tiles && local1 < group;
  const int qh0 = kv_head * group + local0, qh1 = kv_head * group + local1;
  uint32_t qa[kSteps][4];
  {
    const uint16_t* q0 =
        reinterpret_cast<const uint16_t*>(p.q) + (int64_t{seq} * p.num_q_heads + qh0) * kHeadDim;
    const uint16_t* q1 =
        reinterpret_cast<const uint16_t*>(p.q) + (int64_t{seq} * p.num_q_heads + qh1) * kHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int d = t * (kHeadDim / 4) + 4 * s;
      qa[s][0] = qa[s][1] = qa[s][2] = qa[s][3] = 0u;
      if (row0) mma::Bf16x4ToHalf2x2(q0 + d, &qa[s][0], &qa[s][2]);
      if (row1) mma::Bf16x4ToHalf2x2(q1 + d, &qa[s][1], &qa[s][3]);
    }
  }
  const float qk_scale = p.softmax_scale * p.cache.k_codec.scale * kLog2e;
  const float tau = p.sparse_v_threshold;

  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // this thread's share of the running sum
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  ChunkStream<kHeadDim, kVBits, kSparse, 1> stream(p, src, plan.splits, split, seq, kv_head, smem);
  stream.ForEach([&](const St& st) {
    if (head_tile >= plan.head_tiles) return;
    for (int tile = sub; tile < St::kPositions / kTile; tile += wpt) {
      const int base = tile * kTile;
      // S = Q·Kᵀ for tokens g (half 0) and 8 + g (half 1).
      // Two accumulators per half (even and odd k-steps) halve the dependent mma chain.
      float s_acc[2][4], s_odd[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[h][i] = s_odd[h][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < kSteps; s += 4) {
          const uint4 w = *reinterpret_cast<const uint4*>(
              st.k + St::KByte(base, h * 8 + g, t * (kHeadDim / 4) + 4 * s));
          const uint32_t kw[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t b0, b1;
            mma::E4m3x4ToHalf2x2(kw[q], &b0, &b1);
            mma::MmaF16(q % 2 ? s_odd[h] : s_acc[h], qa[s + q], b0, b1);
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[h][i] += s_odd[h][i];
      }
      // Online softmax over the tile: columns 2t, 2t + 1 of each half.
      float sc[2][4];
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool v0 = st.slots[base + h * 8 + 2 * t] >= 0;
        const bool v1 = st.slots[base + h * 8 + 2 * t + 1] >= 0;
        sc[h][0] = v0 ? s_acc[h][0] * qk_scale : -INFINITY;
        sc[h][1] = v1 ? s_acc[h][1] * qk_scale : -INFINITY;
        sc[h][2] = v0 ? s_acc[h][2] * qk_scale : -INFINITY;
        sc[h][3] = v1 ? s_acc[h][3] * qk_scale : -INFINITY;
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
      float pr[2][4];
      bool needed = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pr[h][i] = Exp2Ftz(sc[h][i] - m_use[i / 2]);
          needed |= (i < 2 ? row0 : row1) && pr[h][i] > tau;
        }
      }
      l[0] = l[0] * factor[0] + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
      l[1] = l[1] * factor[1] + pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3];
      RescaleIfMaxMoved(acc, {factor[0], factor[0], factor[1], factor[1]});  // rows g, g + 8
      if (SkipsValues(tau, needed, p.skipped_tiles)) continue;
      const uint32_t pa[4] = {
          mma::PackHalf2(pr[0][0], pr[0][1]), mma::PackHalf2(pr[0][2], pr[0][3]),
          mma::PackHalf2(pr[1][0], pr[1][1]), mma::PackHalf2(pr[1][2], pr[1][3])};
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
      for (int j = 0; j < kNTiles; ++j) mma::MmaF16(acc[j], pa, vb[0][j], vb[1][j]);
    }
  });

  // Finish the sums across the quad, then merge the warps of each head tile through shared memory
  // (the stages, ring and level pairs are free now) into one part per CTA: fewer parts for the
  // combining kernel to read.
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
    // B column n of n-tile j is dim n·D/8 + j.
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      row[2 + (2 * t) * kNTiles + j] = acc[j][2 * r];
      row[2 + (2 * t + 1) * kNTiles + j] = acc[j][2 * r + 1];
    }
  }
  __syncthreads();
  WriteParts<kHeadDim, 16>(merge, plan.tiles_per_cta, wpt,
                           (blockIdx.y % ctas_per_kv) * plan.tiles_per_cta * 16, group, parts,
                           int64_t{seq} * p.num_q_heads + kv_head * group, plan.parts(), split);
}

}  // namespace kvp::attention
