// The attention kernel for few q heads per kv head (at most 8: GQA as in Llama, Qwen, Mistral):
// the q heads are the 8 columns of the mma fragments and the positions are the rows, so a
// kv head's 4 heads waste half of an 8-wide fragment instead of three quarters of a 16-high one.
//
// Per 16-position tile a warp computes Sᵀ = K·Qᵀ (one m16n8k16 per 16 dims: thread t reads 32
// contiguous K bytes of positions g and g + 8 into A fragments, Q sits in B fragments for the
// whole kernel), the online softmax down the columns of Sᵀ, and Oᵀ += Vᵀ·Pᵀ: Pᵀ's B fragments
// are Sᵀ's C fragments transposed in registers (movmatrix), Vᵀ's A fragments are decoded exactly
// like the B fragments of the other kernel (thread g: dims [g·D/8, (g+1)·D/8) of 4 positions).
// Half the mma instructions and half the accumulators of the 16-row layout, so more warps fit.
// A CTA covers two kv heads where the layer's count is even and the positions are many enough
// (kMinPositionsForTwoKvHeads): their rows sit side by side in the cache, so it stages both with
// fewer L2 requests per byte than two CTAs would, and each of its warps takes two tiles at a time
// (kColumnSpans).
//
// Paired heads (kPairedHeads, head_dim 64 with at most 4 q heads a kv head): two cache heads of 64
// dims lie side by side in every row of the cache exactly as one head of 128 does, so the kernel
// runs at kHeadDim = 128 over half as many kv heads (PairedHeadsParams), the q heads of both as its
// columns (at most 8). K·Qᵀ then takes the first cache head's dims in k-steps 0-3 and the second's
// in k-steps 4-7, each half in an accumulator of its own, and a column's scores are its own half's:
// no product of one head's keys with the other's queries reaches them (so a NaN key of one head
// stays out of the other's outputs, as in the reference). Vᵀ·Pᵀ computes all 128 dims for every
// column, of which a q head keeps its own half (MergeWarpsOf). What it saves over one kv head of 64
// a warp: the 8 columns are all used, and each position's softmax and staging serve 128 dims.
#pragma once

#include "kernels/attention/attention_pipeline.cuh"

namespace kvp::attention {

inline constexpr int kMaxColumnHeads = 8;

// One head tile per kv head; a CTA covers `kv_heads_per_cta` consecutive kv heads.
inline Plan HeadsAsColumnsPlan(int kv_heads_per_cta) {
  Plan plan;
  plan.kv_heads_per_cta = kv_heads_per_cta;
  return plan;
}

// How a CTA of two kv heads stages when four such CTAs still fit an SM's shared memory (D = 64
// and 128): 64 positions a chunk, two chunks deep, so that each warp takes a span of two
// 16-position tiles: one softmax reduction for both, and two independent mma chains and decodes to
// hide each other's latency (faster in dense and sparse decode alike: bench/NOTES.md). Otherwise, and for one kv head, kChunk position-heads a chunk, kStages deep.
inline constexpr int kSpanPositions = 64, kSpanDepth = 2, kSpanCtasPerSm = 4;
template <int kHeadDim, int kVBits, int kKvHeads>
inline constexpr bool kColumnSpans =
    kKvHeads == 2 &&
    (kSharedBytes<kHeadDim, kVBits, 2, kSpanPositions, kSpanDepth> + kCtaReservedSharedBytes) *
            kSpanCtasPerSm
        <= kSmSharedBytes;
template <int kHeadDim, int kVBits, int kKvHeads>
inline constexpr int kColumnPositions =
    kColumnSpans<kHeadDim, kVBits, kKvHeads> ? kSpanPositions : kChunk / kKvHeads;
template <int kHeadDim, int kVBits, int kKvHeads>
inline constexpr int kColumnDepth = kColumnSpans<kHeadDim, kVBits, kKvHeads> ? kSpanDepth : kStages;
template <int kHeadDim, int kVBits, int kKvHeads>
inline constexpr int kColumnSharedBytes =
    kSharedBytes<kHeadDim, kVBits, kKvHeads, kColumnPositions<kHeadDim, kVBits, kKvHeads>,
                 kColumnDepth<kHeadDim, kVBits, kKvHeads>>;

// Four CTAs (16 warps) per SM for D <= 128, as many as 4 x 42-53 KB of shared memory allow (stages
// and the ring of row addresses): up to 128 registers. Warp w takes kv head w / kWarpsPerHead of
// the CTA's kKvHeads and, of each staged chunk, the span of kSpan 16-position tiles
// w % kWarpsPerHead.
template <int kHeadDim, int kVBits, bool kSparse, int kKvHeads, bool kPairedHeads = false>
__global__ void __launch_bounds__(kWarps * 32, kHeadDim >= 256 ? 3 : 4)
    HeadsAsColumnsKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  constexpr int kPositions = kColumnPositions<kHeadDim, kVBits, kKvHeads>;
  constexpr int kDepth = kColumnDepth<kHeadDim, kVBits, kKvHeads>;
  using Stream = ChunkStream<kHeadDim, kVBits, kSparse, kKvHeads, kPositions, kDepth, kPairedHeads>;
  using St = typename Stream::St;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of K·Qᵀ, and m-tiles of Vᵀ·Pᵀ
  constexpr int kWarpsPerHead = kWarps / kKvHeads;
  constexpr int kSpan = kPositions / (kWarpsPerHead * kTile);  // tiles a warp takes of a chunk
  static_assert(kSpan * kWarpsPerHead * kTile == kPositions);
  extern __shared__ __align__(16) uint8_t smem[];
  const __half2* pair_levels =
      StartPartsKernel<kHeadDim, kVBits, kKvHeads, kPositions, kDepth>(smem);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int split = blockIdx.x, first_kv_head = blockIdx.y * kKvHeads, seq = blockIdx.z;
  const int head = warp / kWarpsPerHead;  // of the CTA's kv heads
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int64_t cta_q_head = int64_t{seq} * p.num_q_heads + first_kv_head * group;
  const int64_t first_q_head = cta_q_head + head * group;

  // Qᵀ as B fragments: column g is head g, k-step s takes dims t·D/4 + 4s .. + 3 (mma.cuh);
  // paired heads: k-steps s and s + 4 take dims t·16 + 4s .. + 3 of the column's own 64 (only its
  // own half's products are kept), one fragment for both. Loaded here, converted once the first
  // chunks' copies are issued.
  constexpr int kQDim = kQHeadDim<kHeadDim, kPairedHeads>;  // a q head's dims in p.q
  constexpr int kQSteps = kPairedHeads ? kSteps / 2 : kSteps;
  const int heads_per_half = kPairedHeads ? group / 2 : group;
  uint2 q_loaded[kQSteps];
  {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p.q) + (first_q_head + g) * kQDim;
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) {
      const int dim = kPairedHeads ? t * 16 + 4 * s : t * (kHeadDim / 4) + 4 * s;
      q_loaded[s] = g < group ? mma::LoadBf16x4(q + dim) : uint2{0u, 0u};
    }
  }
  uint32_t qb[kQSteps][2];
  auto convert_queries = [&] {
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) mma::Bf16x4ToHalf2x2(q_loaded[s], &qb[s][0], &qb[s][1]);
  };
  const float qk_scale = p.softmax_scale * p.cache.k_codec.scale * kLog2e;
  const float tau = p.sparse_v_threshold;
  const bool real[2] = {2 * t < group, 2 * t + 1 < group};  // heads 2t, 2t + 1
  // Paired heads: whether heads 2t, 2t + 1 read the second cache head (k-steps 4-7).
  const bool second_half[2] = {kPairedHeads && 2 * t >= heads_per_half,
                               kPairedHeads && 2 * t + 1 >= heads_per_half};

  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of heads 2t, 2t + 1
  float l[2] = {0.0f, 0.0f};            // this thread's share of their running sums
  // Oᵀ: m-tile j, row g is dim g·D/8 + 2j, row g + 8 is dim g·D/8 + 2j + 1; columns 2t, 2t + 1.
  float acc[kSteps][4];
#pragma unroll
  for (int j = 0; j < kSteps; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  Stream stream(p, src, plan.splits, split, seq, first_kv_head, smem);
  stream.ForEach(convert_queries, [&](const St& st) {
    const int base = (warp % kWarpsPerHead) * kSpan * kTile;
    // Sᵀ = K·Qᵀ per tile u: rows are positions base + 16u + g and + 8. Two accumulators (even
    // and odd k-steps, or for paired heads the two halves) halve each dependent mma chain.
    float s_acc[kSpan][4], s_odd[kSpan][4];
#pragma unroll
    for (int u = 0; u < kSpan; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s_acc[u][i] = s_odd[u][i] = 0.0f;
      const int row = base + u * kTile;
#pragma unroll
      for (int s = 0; s < kSteps; s += 4) {
        // The 16 K bytes of k-steps s .. s + 3: dims t·D/4 + 4s, or for paired heads t·16 of the
        // half s / 4.
        const int k_byte =
            head * St::kKHead + (kPairedHeads ? s / 4 * 64 + t * 16 : t * (kHeadDim / 4) + 4 * s);
        const uint4 w0 = *reinterpret_cast<const uint4*>(st.k + St::KByte(row, g, k_byte));
        const uint4 w1 = *reinterpret_cast<const uint4*>(st.k + St::KByte(row, g + 8, k_byte));
        const uint32_t k0[4] = {w0.x, w0.y, w0.z, w0.w}, k1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t
              a[4];  // (position g, dims 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
          mma::E4m3x4ToHalf2x2(k0[q], &a[0], &a[2]);
          mma::E4m3x4ToHalf2x2(k1[q], &a[1], &a[3]);
          const bool odd = kPairedHeads ? s >= 4 : q % 2 != 0;
          const int qs = (s + q) % kQSteps;
          mma::MmaF16(odd ? s_odd[u] : s_acc[u], a, qb[qs][0], qb[qs][1]);
        }
      }
    }
    // Online softmax down the columns over the span: c0, c1 = (position g, heads 2t, 2t + 1);
    // c2, c3 = g + 8.
    float sc[kSpan][4];
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int u = 0; u < kSpan; ++u) {
      const bool valid0 = st.slots[base + u * kTile + g] >= 0;
      const bool valid1 = st.slots[base + u * kTile + g + 8] >= 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float dot = !kPairedHeads        ? s_acc[u][i] + s_odd[u][i]
                          : second_half[i % 2] ? s_odd[u][i]
                                               : s_acc[u][i];
        sc[u][i] = (i < 2 ? valid0 : valid1) ? dot * qk_scale : -INFINITY;
      }
      tile_max[0] = fmaxf(tile_max[0], fmaxf(sc[u][0], sc[u][2]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(sc[u][1], sc[u][3]));
    }
    float factor[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2)
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xFFFFFFFFu, tile_max[h], offset));
      factor[h] = FoldTileMax(m[h], tile_max[h], &m_use[h]);
    }
    float pr[kSpan][4];
    bool needed = false;
    l[0] *= factor[0];
    l[1] *= factor[1];
#pragma unroll
    for (int u = 0; u < kSpan; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pr[u][i] = Exp2Ftz(sc[u][i] - m_use[i % 2]);
        needed |= real[i % 2] && pr[u][i] > tau;
      }
      l[0] += pr[u][0] + pr[u][2];
      l[1] += pr[u][1] + pr[u][3];
    }
    RescaleIfMaxMoved(acc, {factor[0], factor[1], factor[0], factor[1]});  // columns 2t, 2t + 1
    // A skipped tile of paired heads is one of each cache head.
    if (SkipsValues(tau, needed, p.skipped_tiles, kPairedHeads ? 2 * kSpan : kSpan)) return;
#pragma unroll
    for (int u = 0; u < kSpan; ++u) {
      // Pᵀ: b0 = (positions 2t, 2t + 1; head g), b1 = (positions 2t + 8, 2t + 9; head g).
      const uint32_t pb0 = mma::Transpose8x8(mma::PackHalf2(pr[u][0], pr[u][1]));
      const uint32_t pb1 = mma::Transpose8x8(mma::PackHalf2(pr[u][2], pr[u][3]));
      // Vᵀ of positions 2t, 2t + 1 (k = 0, 1) and 2t + 8, 2t + 9 (k = 8, 9) of the tile, dims
      // [g·D/8, (g+1)·D/8).
      uint32_t v[2][kHeadDim / 8];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = base + u * kTile + half * 8 + 2 * t;
        DecodeValuePair<kHeadDim, kVBits>(st.v + i * St::kVRow + head * St::kVHead,
                                          st.s + i * St::kSRow + head * St::kSHead, St::kVRow,
                                          St::kSRow, g, pair_levels, v[half]);
      }
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        const uint32_t a[4] = {v[0][2 * j], v[0][2 * j + 1], v[1][2 * j], v[1][2 * j + 1]};
        mma::MmaF16(acc[j], a, pb0, pb1);
      }
    }
  });

  // Finish the sums down the columns, then merge the warps of each kv head through shared memory
  // (the stages, ring and level pairs are free now) into one part per CTA, or, when the CTA is its
  // heads' only one, the output.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2)
      l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], offset);
  }
  constexpr int kRow = kRowFloats<kHeadDim>;
  static_assert(kWarps * kMaxColumnHeads * kRow * 4 <= kMergeBytes<kHeadDim>);
  float* merge = reinterpret_cast<float*>(smem);  // [warp][head 0..7][kRow]
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = merge + (warp * kMaxColumnHeads + 2 * t + h) * kRow;
    if (g == 0) {
      row[0] = m[h];
      row[1] = l[h];
    }
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
      row[kAccOffset + g * (kHeadDim / 8) + 2 * j] = acc[j][h];
      row[kAccOffset + g * (kHeadDim / 8) + 2 * j + 1] = acc[j][2 + h];
    }
  }
  __syncthreads();
  constexpr int kHeadRows = kWarpsPerHead * kMaxColumnHeads * kRow;  // a kv head's warps' rows
  if (plan.parts() > 1) {
#pragma unroll
    for (int h = 0; h < kKvHeads; ++h) {
      WriteParts<kHeadDim, kMaxColumnHeads, kPairedHeads>(merge + h * kHeadRows, 1, kWarpsPerHead,
                                                          0, group, parts, cta_q_head + h * group,
                                                          plan.parts(), split, heads_per_half);
    }
    return;
  }
  // The only part of its heads: finish them here, without the combining kernel.
  float* x = merge + kWarps * kMaxColumnHeads * kRow;  // [head][D]
  static_assert((kWarps + 1) * kMaxColumnHeads * kRow * 4 <= kMergeBytes<kHeadDim>);
  for (int h = 0; h < kKvHeads; ++h) {
    WriteOutputs<kHeadDim, kMaxColumnHeads, kPairedHeads>(merge + h * kHeadRows, 1, kWarpsPerHead,
                                                          0, group, x, p, cta_q_head + h * group,
                                                          heads_per_half);
    __syncthreads();  // x is written again for the next kv head
  }
}

}  // namespace kvp::attention
