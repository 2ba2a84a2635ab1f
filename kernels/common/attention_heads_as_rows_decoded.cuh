// The heads-as-rows kernel for CTAs of several head tiles of one kv head (32 or more q heads per kv
// head, e.g. MLA's 128): each staged chunk is decoded once, by all the CTA's threads, into f16 K
// and V rows in shared memory, which every warp then reads into mma fragments with ldmatrix, 64
// (or 32) positions at a time.
//
// In attention_heads_as_rows.cuh each warp converts K and decodes TurboNV V itself, so a CTA of
// four head tiles decodes every position four times, and a warp takes 16 positions at a time.
// H200, sparse decode of 2,048 positions, 128 q heads on one kv head, batch 128: 181.8 us there,
// 175 with the chunk decoded once, 154 with 32-position spans, 148.4 with 64 (one softmax
// reduction and twice the independent mma per span). What still limits it (Nsight Compute): 8
// warps an SM (registers), stalled mostly on the fixed latency of dependent instructions, with the
// tensor pipe busy a fifth of the time; a CTA's warps decode, wait at a barrier and compute in
// lockstep.
//
// The f16 rows keep the dims in order (the other kernel permutes them per thread), so Q's A
// fragments and the accumulators' columns are the plain m16n8k16 ones (mma.cuh).
#pragma once

#include "kernels/common/attention_heads_as_rows.cuh"

namespace kvp::attention {

// One chunk decoded to f16, K and V alike: kChunk rows of kHeadDim values (rotated domain, V
// without the layer's v_scale, as DecodeValuePair). Row r's 16-byte piece k sits at piece
// k ^ (r & 7) ^ ((k >> 3) & 1): the eight rows of an ldmatrix read fall on different banks, and so
// do the stores of eight threads decoding pieces 2c (or 2c + 1) of one row, c = 0..7.
template <int kHeadDim>
struct DecodedChunk {
  static constexpr int kRowBytes = 2 * kHeadDim;
  static constexpr int kBytes = kChunk * kRowBytes;
  KVP_HD static int Byte(int r, int byte) {
    const int piece = byte >> 4;
    return r * kRowBytes + ((piece ^ (r & 7) ^ ((piece >> 3) & 1)) << 4) + (byte & 15);
  }
};

// Shared memory: the stages, the position ring and the level pairs as for the other kernels, then
// the decoded K and V.
template <int kHeadDim, int kVBits>
inline constexpr int kDecodedOffset = kPairLevelsOffset<kHeadDim, kVBits, 1> + (4 << (2 * kVBits));
template <int kHeadDim, int kVBits>
inline constexpr int kDecodedSharedBytes =
    kDecodedOffset<kHeadDim, kVBits> + 2 * DecodedChunk<kHeadDim>::kBytes > kMergeBytes<kHeadDim>
        ? kDecodedOffset<kHeadDim, kVBits> + 2 * DecodedChunk<kHeadDim>::kBytes
        : kMergeBytes<kHeadDim>;

// Decodes a staged chunk into k_out and v_out (DecodedChunk), with all the CTA's threads: thread i
// takes the 16-dim piece i % (D/16) (16 K bytes, one TurboNV group) of every (kWarps·32·16/D)-th
// row from i / (D/16), so a quarter warp reads 128 contiguous staged bytes.
template <int kHeadDim, int kVBits>
__device__ __forceinline__ void DecodeChunk(const Stage<kHeadDim, kVBits, 1>& st,
                                            const __half2* pair_levels, uint8_t* k_out,
                                            uint8_t* v_out) {
  using St = Stage<kHeadDim, kVBits, 1>;
  using Out = DecodedChunk<kHeadDim>;
  constexpr int kPieces = kHeadDim / 16;
  constexpr int kRowsPerPass = kWarps * 32 / kPieces;
  static_assert(kChunk % kRowsPerPass == 0);
  const int c = threadIdx.x % kPieces;
  const uint8_t* table = reinterpret_cast<const uint8_t*>(pair_levels);
#pragma unroll
  for (int r = threadIdx.x / kPieces; r < kChunk; r += kRowsPerPass) {
    uint32_t h[8];
    const uint4 w = *reinterpret_cast<const uint4*>(st.k + St::KByte(0, r, 16 * c));
    mma::E4m3x4ToHalf2x2(w.x, &h[0], &h[1]);
    mma::E4m3x4ToHalf2x2(w.y, &h[2], &h[3]);
    mma::E4m3x4ToHalf2x2(w.z, &h[4], &h[5]);
    mma::E4m3x4ToHalf2x2(w.w, &h[6], &h[7]);
    *reinterpret_cast<uint4*>(k_out + Out::Byte(r, 32 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(k_out + Out::Byte(r, 32 * c + 16)) =
        make_uint4(h[4], h[5], h[6], h[7]);
    // Codes 2i, 2i + 1 are adjacent in the group's bits: one 2N-bit field indexes their pair.
    const uint64_t bits = GroupCodes<kVBits>(st.v + r * St::kVRow, c);
    const __half2_raw scale_raw = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>(st.s[r * St::kSRow + c] * 0x0101u), __NV_E4M3);
    const __half2 scale = *reinterpret_cast<const __half2*>(&scale_raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t offset = FieldByteOffset<2 * kVBits>(bits, 2 * kVBits * i);
      const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(table + offset), scale);
      h[i] = *reinterpret_cast<const uint32_t*>(&v);
    }
    *reinterpret_cast<uint4*>(v_out + Out::Byte(r, 32 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(v_out + Out::Byte(r, 32 * c + 16)) =
        make_uint4(h[4], h[5], h[6], h[7]);
  }
}

// Launched with two or four head tiles a CTA (WithPartsKernel): one or two warps a head tile.
template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32)
    HeadsAsRowsDecodedKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  using St = Stage<kHeadDim, kVBits, 1>;
  using Decoded = DecodedChunk<kHeadDim>;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  constexpr int kNTiles = kHeadDim / 8;  // n-tiles of P·V
  extern __shared__ __align__(16) uint8_t smem[];
  const __half2* pair_levels = StartPartsKernel<kHeadDim, kVBits, 1>(smem);
  uint8_t* k_rows = smem + kDecodedOffset<kHeadDim, kVBits>;
  uint8_t* v_rows = k_rows + Decoded::kBytes;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t = lane % 4;
  const HeadTileOfWarp w = HeadTileOfWarp::Of(p, plan, warp);

  // Q's A fragments in dim order: k-step s takes dims 16s + 2t, + 1 (a0, a1) and 16s + 2t + 8, + 9.
  uint32_t qa[kSteps][4];
  {
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(p.q + w.q_head0 * kHeadDim);
    const uint32_t* q1 = q0 + 8 * kHeadDim / 2;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int pair = 8 * s + t;  // bf16 pairs: dims 2·pair, 2·pair + 1
      qa[s][0] = w.row0 ? mma::Bf16x2ToHalf2(q0[pair]) : 0u;
      qa[s][1] = w.row1 ? mma::Bf16x2ToHalf2(q1[pair]) : 0u;
      qa[s][2] = w.row0 ? mma::Bf16x2ToHalf2(q0[pair + 4]) : 0u;
      qa[s][3] = w.row1 ? mma::Bf16x2ToHalf2(q1[pair + 4]) : 0u;
    }
  }
  const float qk_scale = p.softmax_scale * p.cache.k_codec.scale * kLog2e;
  const float tau = p.sparse_v_threshold;

  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units), rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // this thread's share of the running sum
  float acc[kNTiles][4];                // n-tile j: dims 8j + 2t, + 1
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // The ldmatrix rows this lane addresses, relative to the first of 16 positions (a multiple of 8,
  // so the rows' permutation and these offsets are the same for every 16): for K, matrix lane / 8
  // = (positions 8·(lane / 16).., dims 16s + 8·((lane / 8) % 2)..), the B fragments (b0, b1) of
  // both 8-position halves of k-step s; for V, matrix lane / 8 = (positions 8·((lane / 8) % 2)..,
  // dims 8j + 8·(lane / 16)..), (b0, b1) of n-tiles j and j + 1.
  const int k_row = (lane / 16) * 8 + lane % 8, k_byte = ((lane / 8) % 2) * 16;
  const int v_row = ((lane / 8) % 2) * 8 + lane % 8, v_byte = (lane / 16) * 16;

  // Attention over kSpan decoded positions from `base` of the staged chunk.
  auto Span = [&](auto span_positions, const St& st, int base) {
    constexpr int kSpan = decltype(span_positions)::value;
    // Two accumulators an n-tile (even and odd k-steps) where a span of 32 leaves too few
    // independent mma chains; 64 positions have eight n-tiles, and registers for only one set.
    constexpr int kChains = kSpan < 64 ? 2 : 1;
    const uint8_t* k_span = k_rows + base * Decoded::kRowBytes;
    const uint8_t* v_span = v_rows + base * Decoded::kRowBytes;
    float s_acc[kChains][kSpan / 8][4] = {};  // S = Q·Kᵀ, 8 positions an n-tile
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int half = 0; half < kSpan / 16; ++half) {
        uint32_t b[4];
        mma::LoadMatrices(
            k_span + half * 16 * Decoded::kRowBytes + Decoded::Byte(k_row, 32 * s + k_byte), b);
        mma::MmaF16(s_acc[s % kChains][2 * half], qa[s], b[0], b[1]);
        mma::MmaF16(s_acc[s % kChains][2 * half + 1], qa[s], b[2], b[3]);
      }
    }
    if constexpr (kChains == 2) {
#pragma unroll
      for (int h = 0; h < kSpan / 8; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[0][h][i] += s_acc[1][h][i];
      }
    }
    uint32_t pa[kSpan / 16][4];
    if (!TileSoftmax(s_acc[0], st.slots + base, qk_scale, w.row0, w.row1, tau, p.skipped_tiles, m,
                     l, acc, pa)) {
      return;
    }
#pragma unroll
    for (int j = 0; j < kNTiles; j += 2) {
#pragma unroll
      for (int half = 0; half < kSpan / 16; ++half) {
        uint32_t b[4];
        mma::LoadMatricesTransposed(
            v_span + half * 16 * Decoded::kRowBytes + Decoded::Byte(v_row, 16 * j + v_byte), b);
        mma::MmaF16(acc[j], pa[half], b[0], b[1]);
        mma::MmaF16(acc[j + 1], pa[half], b[2], b[3]);
      }
    }
  };

  ChunkStream<kHeadDim, kVBits, kSparse, 1> stream(p, src, plan.splits, blockIdx.x, w.seq,
                                                   w.kv_head, smem);
  stream.ForEach([&](const St& st) {
    DecodeChunk<kHeadDim, kVBits>(st, pair_levels, k_rows, v_rows);
    __syncthreads();  // every thread calls consume; the next chunk's barrier protects the rows
    if (!w.real) return;
    // A warp takes its head tile's positions in spans: all 64 of the chunk at once when it is
    // the tile's only warp (a CTA of four head tiles) and the registers allow (D <= 128), else
    // 32 at a time. Longer spans give more independent mma and one softmax reduction for all
    // their positions.
    if (kHeadDim <= 128 && w.warps_per_tile == 1) {
      Span(IntConstant < kHeadDim <= 128 ? kChunk : kChunk / 2 > {}, st, 0);
    } else {
      for (int base = w.sub * (kChunk / 2); base < kChunk; base += w.warps_per_tile * (kChunk / 2))
        Span(IntConstant<kChunk / 2>{}, st, base);
    }
  });

  FinishHeadTiles<kHeadDim, kNTiles>(
      p, plan, w, m, l, acc, [](int j, int column) { return 8 * j + column; }, smem, parts);
}

}  // namespace kvp::attention
