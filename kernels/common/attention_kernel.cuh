// The attention core shared by dense paged decode and sparse decode on the GPU: flash-decoding
// over FP8 K and TurboNV V with tensor cores.
//
// Work split: a CTA takes (sequence, kv head, up to 4 tiles of 16 q heads, split of the
// positions). All its threads stage 64 positions at a time (K, V codes, V scales) into shared
// memory with cp.async, three stages deep (positions and block ids are loaded an iteration ahead);
// each warp walks 16-position tiles of the staged chunks for its head tile with its own running
// max, sum and accumulator, and at the end the warps of a head tile merge in shared memory into one
// "part" per CTA. A second kernel merges the parts of each q head, applies the inverse
// Walsh-Hadamard rotation once and writes the output.
//
// Per 16-position tile a warp computes S = Q·Kᵀ (two m16n8k16 per 16 dims; thread t reads 32
// contiguous K bytes of a row into B fragments), the online softmax on S in the C fragments, and
// O += P·V where P's A fragments are S's C fragments (no shuffles) and V is dequantized into B
// fragments: thread g decodes dims [g·D/8, (g+1)·D/8) of 4 positions, which for D = 128 is exactly
// TurboNV group g. Accumulation stays in the rotated domain.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_params.h"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/launch_status.h"
#include "kernels/common/mma.cuh"
#include "kvpool/format/turbo_codebook.h"

namespace kvp::attention {

inline constexpr int kWarps = 4;
inline constexpr int kTile = 16;
inline constexpr float kLog2e = 1.4426950408889634f;

// A B fragment's worth of V: dims [g·D/8, (g+1)·D/8) of two consecutive staged positions
// (rotated domain), as f16 pairs (first position in the low half). D = 128: TurboNV group g;
// D = 256: groups 2g, 2g + 1; D = 64: half of group g / 2. `pair_levels[c0 | c1 << N]` holds the
// two levels as f16, so a pair costs one table read and one f16x2 multiply by the two scales.
// Masked positions were staged as zeros: scale 0, values 0.
template <int kHeadDim, int kVBits>
__device__ __forceinline__ void DecodeValuePair(const uint8_t* vdata0, const uint8_t* vscale0,
                                                int v_row, int s_row, float v_scale, int g,
                                                const __half2* pair_levels, uint32_t* out) {
  constexpr int kDims = kHeadDim / 8;
  constexpr int kGroups = kDims >= 16 ? kDims / 16 : 1;
  constexpr int kPerGroup = kDims >= 16 ? 16 : kDims;
  constexpr uint32_t kMask = (1u << kVBits) - 1u;
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int grp = kDims >= 16 ? g * kGroups + q : g / 2;
    const int first_elem = kDims >= 16 ? 0 : (g % 2) * kDims;
    uint64_t bits[2];
    float scale[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint8_t* bytes = vdata0 + k * v_row + grp * kTurboGroupBytes<kVBits>;
      if constexpr (kVBits == 2) {
        bits[k] = *reinterpret_cast<const uint32_t*>(bytes);
      } else if constexpr (kVBits == 3) {
        const uint16_t* h16 = reinterpret_cast<const uint16_t*>(bytes);
        bits[k] = uint64_t{h16[0]} | (uint64_t{h16[1]} << 16) | (uint64_t{h16[2]} << 32);
      } else {
        bits[k] = *reinterpret_cast<const uint64_t*>(bytes);
      }
      const __half_raw sh = __nv_cvt_fp8_to_halfraw(vscale0[k * s_row + grp], __NV_E4M3);
      scale[k] = __half2float(__half(sh)) * v_scale;
    }
    const __half2 scales = __floats2half2_rn(scale[0], scale[1]);
    if (first_elem != 0) {
      bits[0] >>= kVBits * first_elem;
      bits[1] >>= kVBits * first_elem;
    }
#pragma unroll
    for (int i = 0; i < kPerGroup; ++i) {
      const uint32_t index = static_cast<uint32_t>((bits[0] >> (kVBits * i)) & kMask) |
                             (static_cast<uint32_t>((bits[1] >> (kVBits * i)) & kMask) << kVBits);
      const __half2 v = __hmul2(pair_levels[index], scales);
      out[q * 16 + i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
}

// Where a CTA's positions come from.
struct PositionSource {
  const int32_t* indices = nullptr;  // sparse: [num_seqs, topk]; null for dense
  int32_t topk = 0;
  int32_t window = 0;  // dense only
};

inline constexpr int kChunk = kWarps * kTile;  // positions staged in shared memory per step
inline constexpr int kStages = 3;              // cp.async pipeline depth

// How the work is cut. A CTA covers `tiles_per_cta` head tiles of one kv head; its warps split
// into head tiles (warp / warps_per_head_tile) and, within one, take every
// warps_per_head_tile-th 16-position tile of each staged chunk.
struct Plan {
  int head_tiles = 1;     // ceil(q heads per kv head / 16)
  int tiles_per_cta = 1;  // head tiles one CTA covers: 1, 2 or 4
  int splits = 1;         // CTAs along the positions
  KVP_HD int warps_per_head_tile() const { return kWarps / tiles_per_cta; }
  KVP_HD int ctas_per_kv_head() const { return (head_tiles + tiles_per_cta - 1) / tiles_per_cta; }
  KVP_HD int parts() const { return splits; }  // the warps of a head tile merge in the CTA
};

// Partial results: [num_seqs, num_q_heads, parts, D + 2] floats = (max in log2 units, sum, acc[D]).
inline size_t PartialBytes(const AttentionParams& p, const Plan& plan) {
  return size_t(p.num_seqs) * p.num_q_heads * plan.parts() * (p.cache.head_dim + 2) * sizeof(float);
}

inline Plan MakePlan(const AttentionParams& p, int positions, int num_sms) {
  Plan plan;
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  plan.head_tiles = (group + 15) / 16;
  plan.tiles_per_cta = plan.head_tiles >= 4 ? 4 : (plan.head_tiles >= 2 ? 2 : 1);
  const int chunks = (positions + kChunk - 1) / kChunk;
  const int base = p.num_seqs * p.cache.num_kv_heads * plan.ctas_per_kv_head();
  const int want = (4 * num_sms + base - 1) / (base > 0 ? base : 1);
  plan.splits = want < 1 ? 1 : (want > chunks ? (chunks > 0 ? chunks : 1) : want);
  return plan;
}

// Shared-memory layout of one pipeline stage: K rows padded by 16 bytes (conflict-free 16-byte
// reads), V code rows, V scale rows, and each staged position (-1 = masked).
template <int kHeadDim, int kVBits>
struct Stage {
  static constexpr int kKRow = kHeadDim + 16;
  static constexpr int kVRow = kHeadDim * kVBits / 8;
  static constexpr int kSRow = kHeadDim / 16;
  static constexpr int kKBytes = kChunk * kKRow;
  static constexpr int kVBytes = kChunk * kVRow;
  static constexpr int kSBytes = kChunk * kSRow;
  static constexpr int kBytes = kKBytes + kVBytes + kSBytes + kChunk * 4;
  static_assert(kKBytes % 16 == 0 && kVBytes % 16 == 0 && kSBytes % 16 == 0);
};

// The stages, then the f16 level pairs of the codebook.
template <int kHeadDim, int kVBits>
inline constexpr int kSharedBytes = kStages* Stage<kHeadDim, kVBits>::kBytes + (4 << (2 * kVBits));

template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionPartsKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  using St = Stage<kHeadDim, kVBits>;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  constexpr int kNTiles = kHeadDim / 8;  // n-tiles of P·V; also V dims per thread
  extern __shared__ __align__(16) uint8_t smem[];
  __half2* pair_levels = reinterpret_cast<__half2*>(smem + kStages * St::kBytes);

  const LayerCache& c = p.cache;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int split = blockIdx.x;
  const int ctas_per_kv = plan.ctas_per_kv_head();
  const int kv_head = blockIdx.y / ctas_per_kv;
  const int wpt = plan.warps_per_head_tile();
  const int head_tile = (blockIdx.y % ctas_per_kv) * plan.tiles_per_cta + warp / wpt;
  const int sub = warp % wpt;
  const int seq = blockIdx.z;
  const int group = p.num_q_heads / c.num_kv_heads;
  for (int e = threadIdx.x; e < (1 << (2 * kVBits)); e += blockDim.x) {
    pair_levels[e] = __floats2half2_rn(TurboLevel<kVBits>(e & ((1 << kVBits) - 1)),
                                       TurboLevel<kVBits>(e >> kVBits));
  }

  const int32_t len = p.seq_lens[seq];
  const int32_t* table = p.block_tables + int64_t{seq} * p.block_table_stride;
  int32_t first = 0, window_start = 0, count;
  if constexpr (kSparse) {
    count = src.topk;
  } else {
    window_start = src.window > 0 && len > src.window ? len - src.window : 0;
    first = window_start & ~(kTile - 1);
    count = len - first;
  }
  const int chunks = count > 0 ? (count + kChunk - 1) / kChunk : 0;
  const int per_split = (chunks + plan.splits - 1) / plan.splits;
  const int chunk_begin = split * per_split;
  const int chunk_end = min(chunks, chunk_begin + per_split);

  // Two threads per staged position: thread pair i stages position i of each chunk. Its position
  // and block id are loaded an iteration before they are needed, so the cp.async of a chunk never
  // waits on a dependent load of the block table (or of the top-k indices).
  const int pair = threadIdx.x / 2, half = threadIdx.x % 2;
  auto position_of = [&](int chunk) -> int32_t {
    if (chunk >= chunk_end) return -1;
    if constexpr (kSparse) {
      const int idx = chunk * kChunk + pair;
      const int32_t pos = idx < src.topk ? src.indices[int64_t{seq} * src.topk + idx] : -1;
      return pos >= 0 && pos < len ? pos : -1;
    } else {
      const int32_t pos = first + chunk * kChunk + pair;
      return pos >= window_start && pos < len ? pos : -1;
    }
  };
  auto block_of = [&](int32_t pos) -> int32_t { return pos >= 0 ? table[pos / c.block_size] : 0; };
  // Stages chunk `chunk` (position `pos`, in block `block`) into stage `chunk % kStages`.
  auto issue = [&](int chunk, int32_t pos, int32_t block) {
    uint8_t* st = smem + (chunk % kStages) * St::kBytes;
    int32_t* pos_s = reinterpret_cast<int32_t*>(st + St::kKBytes + St::kVBytes + St::kSBytes);
    if (half == 0) pos_s[pair] = pos;
    const bool valid = pos >= 0;
    const int slot = valid ? pos % c.block_size : 0;
    const uint8_t* k_row = c.K(block, slot, kv_head);
    const uint8_t* v_row = c.VData(block, slot, kv_head);
    const uint8_t* s_row = c.VScale(block, slot, kv_head);
    uint8_t* k_dst = st + pair * St::kKRow;
    uint8_t* v_dst = st + St::kKBytes + pair * St::kVRow;
    uint8_t* s_dst = st + St::kKBytes + St::kVBytes + pair * St::kSRow;
    for (int o = half * 16; o < kHeadDim; o += 32)
      cp_async::Copy<16>(k_dst + o, k_row + o, valid ? 16 : 0);
    for (int o = half * 8; o < St::kVRow; o += 16)
      cp_async::Copy<8>(v_dst + o, v_row + o, valid ? 8 : 0);
    for (int o = half * 4; o < St::kSRow; o += 8)
      cp_async::Copy<4>(s_dst + o, s_row + o, valid ? 4 : 0);
  };

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
  const float qk_scale = p.softmax_scale * c.k_codec.scale * kLog2e;
  const float tau = p.sparse_v_threshold;
  const float v_scale = c.v_codec.scale;

  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // this thread's share of the running sum
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int32_t pos = position_of(chunk_begin + s);
    if (chunk_begin + s < chunk_end) issue(chunk_begin + s, pos, block_of(pos));
    cp_async::Commit();
  }
  int32_t next_pos = position_of(chunk_begin + kStages - 1);  // for the next issue
  int32_t next_block = block_of(next_pos);
  int32_t later_pos = position_of(chunk_begin + kStages);  // for the one after
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    cp_async::Wait<kStages - 2>();
    __syncthreads();  // chunk is staged, and every warp is done with the stage refilled next
    if (chunk + kStages - 1 < chunk_end) issue(chunk + kStages - 1, next_pos, next_block);
    cp_async::Commit();
    // Loads for the next iterations, in flight while this one computes.
    next_pos = later_pos;
    next_block = block_of(later_pos);
    later_pos = position_of(chunk + kStages + 1);
    if (head_tile >= plan.head_tiles) continue;
    const uint8_t* st = smem + (chunk % kStages) * St::kBytes;
    const uint8_t* k_s = st;
    const uint8_t* v_s = st + St::kKBytes;
    const uint8_t* s_s = st + St::kKBytes + St::kVBytes;
    const int32_t* pos_s =
        reinterpret_cast<const int32_t*>(st + St::kKBytes + St::kVBytes + St::kSBytes);

    for (int tile = sub; tile < kWarps; tile += wpt) {
      const int base = tile * kTile;
      // S = Q·Kᵀ for tokens g (half 0) and 8 + g (half 1).
      // Two accumulators per half (even and odd k-steps) halve the dependent mma chain.
      float s_acc[2][4], s_odd[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[h][i] = s_odd[h][i] = 0.0f;
        const uint8_t* row = k_s + (base + h * 8 + g) * St::kKRow + t * (kHeadDim / 4);
#pragma unroll
        for (int s = 0; s < kSteps; s += 4) {
          const uint4 w = *reinterpret_cast<const uint4*>(row + 4 * s);
          const uint32_t kw[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            mma::MmaF16(q % 2 ? s_odd[h] : s_acc[h], qa[s + q], mma::E4m3x2ToHalf2(kw[q] & 0xFFFFu),
                        mma::E4m3x2ToHalf2(kw[q] >> 16));
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
        const bool v0 = pos_s[base + h * 8 + 2 * t] >= 0;
        const bool v1 = pos_s[base + h * 8 + 2 * t + 1] >= 0;
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
        const float m_new = fmaxf(m[r], tile_max[r]);
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
        factor[r] = exp2f(m[r] - m_use[r]);
        m[r] = m_new;
      }
      float pr[2][4];
      bool needed = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pr[h][i] = exp2f(sc[h][i] - m_use[i / 2]);
          needed |= (i < 2 ? row0 : row1) && pr[h][i] > tau;
        }
      }
      l[0] = l[0] * factor[0] + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
      l[1] = l[1] * factor[1] + pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3];
      // The running max settles quickly: rescale only when some row's max moved.
      if (__any_sync(0xFFFFFFFFu, factor[0] != 1.0f || factor[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          acc[j][0] *= factor[0];
          acc[j][1] *= factor[0];
          acc[j][2] *= factor[1];
          acc[j][3] *= factor[1];
        }
      }
      // Sparse-V: a tile whose every weight (of real heads) is <= τ adds no V; τ = 0 never skips.
      if (tau > 0.0f && !__any_sync(0xFFFFFFFFu, needed)) {
        if (p.skipped_tiles != nullptr && lane == 0) atomicAdd(p.skipped_tiles, 1u);
        continue;
      }
      const uint32_t pa[4] = {
          mma::PackHalf2(pr[0][0], pr[0][1]), mma::PackHalf2(pr[0][2], pr[0][3]),
          mma::PackHalf2(pr[1][0], pr[1][1]), mma::PackHalf2(pr[1][2], pr[1][3])};
      // V of tokens 2t, 2t + 1 (B rows k = 0, 1) and 8 + 2t, 9 + 2t (k = 8, 9), dims [g·D/8,
      // (g+1)·D/8).
      uint32_t vb[2][kNTiles];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = base + half * 8 + 2 * t;
        DecodeValuePair<kHeadDim, kVBits>(v_s + i * St::kVRow, s_s + i * St::kSRow, St::kVRow,
                                          St::kSRow, v_scale, g, pair_levels, vb[half]);
      }
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) mma::MmaF16(acc[j], pa, vb[0][j], vb[1][j]);
    }
  }
  cp_async::Wait<0>();

  // Finish the sums across the quad, then merge the warps of each head tile through shared memory
  // (the stages are free now) into one part per CTA: fewer parts for the combining kernel to read.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
  constexpr int kRowFloats = kHeadDim + 2;  // (max, sum, acc[D]) of one q head
  static_assert(kWarps * 16 * kRowFloats * 4 <= kStages * St::kBytes,
                "merge area exceeds the stages");
  float* merge = reinterpret_cast<float*>(smem);  // [warp][row 0..15][kRowFloats]
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* row = merge + (warp * 16 + g + 8 * r) * kRowFloats;
    if (t == 0) {
      row[0] = m[r];
      row[1] = l[r];
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      row[2 + (2 * t) * kNTiles + j] = acc[j][2 * r];
      row[2 + (2 * t + 1) * kNTiles + j] = acc[j][2 * r + 1];
    }
  }
  __syncthreads();
  const int parts_n = plan.parts();
  const int cta_tile0 = (blockIdx.y % ctas_per_kv) * plan.tiles_per_cta;
  for (int i = threadIdx.x; i < plan.tiles_per_cta * 16 * kHeadDim; i += blockDim.x) {
    const int e = i % kHeadDim, row = (i / kHeadDim) % 16, tile = i / (kHeadDim * 16);
    const int local = (cta_tile0 + tile) * 16 + row;
    if (cta_tile0 + tile >= plan.head_tiles || local >= group) continue;
    const float* w0 = merge + ((tile * wpt) * 16 + row) * kRowFloats;  // first warp of the tile
    float max_m = -INFINITY;
    for (int w = 0; w < wpt; ++w) max_m = fmaxf(max_m, w0[w * 16 * kRowFloats]);
    float sum = 0.0f, o = 0.0f;
    if (max_m != -INFINITY) {
      for (int w = 0; w < wpt; ++w) {
        const float* part = w0 + w * 16 * kRowFloats;
        const float scale = exp2f(part[0] - max_m);
        sum += scale * part[1];
        o += scale * part[2 + e];
      }
    }
    float* out =
        parts +
        ((int64_t{seq} * p.num_q_heads + kv_head * group + local) * parts_n + split) * kRowFloats;
    if (e == 0) {
      out[0] = max_m;
      out[1] = sum;
    }
    out[2 + e] = o;
  }
}

// Merges the parts of one (sequence, q head), rotates back and writes out. Block: D threads.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim)
    AttentionCombineKernel(AttentionParams p, int parts_n, const float* parts) {
  __shared__ float x[kHeadDim];
  const int e = threadIdx.x;
  const int qh = blockIdx.x, seq = blockIdx.y;
  const float* base = parts + (int64_t{seq} * p.num_q_heads + qh) * parts_n * (kHeadDim + 2);
  float max_m = -INFINITY;
#pragma unroll 8
  for (int i = 0; i < parts_n; ++i) max_m = fmaxf(max_m, base[i * (kHeadDim + 2)]);
  float sum = 0.0f, o = 0.0f;
  if (max_m != -INFINITY) {
#pragma unroll 8
    for (int i = 0; i < parts_n; ++i) {
      const float* part = base + i * (kHeadDim + 2);
      const float w = exp2f(part[0] - max_m);
      sum += w * part[1];
      o += w * part[2 + e];
    }
  }
  x[e] = sum > 0.0f ? o / sum : 0.0f;
  __syncthreads();
  const LayerCache& c = p.cache;
  if (TraitsOf(c.v_codec.format).turbo && c.v_codec.rotate) {
#pragma unroll
    for (int h = 1; h < kHeadDim; h *= 2) {
      float mine = x[e], other = x[e ^ h];
      __syncthreads();
      x[e] = (e & h) ? other - mine : mine + other;
      __syncthreads();
    }
    const float v = x[e] * InvSqrtHeadDim(kHeadDim);
    x[e] = c.v_codec.signs.Negative(e) ? -v : v;
  }
  p.out[(int64_t{seq} * p.num_q_heads + qh) * kHeadDim + e] = x[e];
}

inline int SmCount() {
  static int sms = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 132;
  }();
  return sms;
}

// Checks what the kernels support and launches both kernels. `positions` bounds a sequence's
// positions (max_seq_len, or topk).
template <bool kSparse>
LaunchStatus LaunchAttention(const AttentionParams& p, const PositionSource& src, int positions,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const LayerCache& c = p.cache;
  if (c.k_codec.format != KvFormat::kFp8E4m3) return Unsupported("K formats other than fp8_e4m3");
  if (p.num_seqs == 0) return {};
  const Plan plan = MakePlan(p, positions, SmCount());
  if (workspace_bytes < PartialBytes(p, plan)) return LaunchStatus{cudaErrorInvalidValue, nullptr};
  float* parts = static_cast<float*>(workspace);
  const dim3 grid(plan.splits, c.num_kv_heads * plan.ctas_per_kv_head(), p.num_seqs);
  auto run = [&](auto head_dim, auto bits) -> LaunchStatus {
    constexpr int kD = decltype(head_dim)::value, kBits = decltype(bits)::value;
    constexpr int kSmem = kSharedBytes<kD, kBits>;
    auto* kernel = AttentionPartsKernel<kD, kBits, kSparse>;
    static const cudaError_t attr = [&] {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      if (e != cudaSuccess) return e;
      return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
    }();
    if (attr != cudaSuccess) return LaunchStatus{attr, nullptr};
    kernel<<<grid, kWarps * 32, kSmem, stream>>>(p, src, plan, parts);
    AttentionCombineKernel<kD>
        <<<dim3(p.num_q_heads, p.num_seqs), kD, 0, stream>>>(p, plan.parts(), parts);
    return LastLaunchError();
  };
  auto with_dim = [&](auto head_dim) -> LaunchStatus {
    switch (c.v_codec.format) {
      case KvFormat::kTurbo2:
        return run(head_dim, IntConstant<2>{});
      case KvFormat::kTurbo3:
        return run(head_dim, IntConstant<3>{});
      case KvFormat::kTurbo4:
        return run(head_dim, IntConstant<4>{});
      default:
        return Unsupported("V formats other than turbo2/3/4");
    }
  };
  switch (c.head_dim) {
    case 64:
      return with_dim(IntConstant<64>{});
    case 128:
      return with_dim(IntConstant<128>{});
    case 256:
      return with_dim(IntConstant<256>{});
    default:
      return Unsupported("this head_dim");
  }
}

inline size_t AttentionWorkspaceBytes(const AttentionParams& p, int positions) {
  return PartialBytes(p, MakePlan(p, positions, SmCount()));
}

}  // namespace kvp::attention
