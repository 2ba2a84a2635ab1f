// The heads-as-rows kernel for CTAs of several head tiles of one kv head (32 or more q heads per kv
// head, e.g. MLA's 128): each staged chunk is decoded once, by all the CTA's threads, into f16 K
// and V rows in shared memory. A CTA of four head tiles (64 heads: a warpgroup's M) computes S
// for the whole chunk with wgmma, K read from shared memory as the decode laid it; otherwise each
// warp reads K with ldmatrix, 32 positions at a time. P·V reads V with ldmatrix into mma.sync.
//
// In attention_heads_as_rows.cuh each warp converts K and decodes TurboNV V itself, so a CTA of
// four head tiles decodes every position four times, and a warp takes 16 positions at a time.
// Here the chunk is decoded once, a warp takes spans of 64 positions (one softmax reduction and
// twice the independent mma per span), S comes from wgmma, and a CTA that is its heads' only
// part writes their outputs itself (no combining kernel); each of these was faster for 128 q
// heads on one kv head (bench/NOTES.md, sparse decode). What limits it is a CTA's warps decoding,
// waiting at a barrier and computing in lockstep, 8 warps an SM (registers), mostly stalled on
// the latency of dependent instructions.
//
// The f16 rows keep the dims in order (the other kernel permutes them per thread), so Q's A
// fragments and the accumulators' columns are the plain m16n8k16 ones (mma.cuh).
#pragma once

#include <type_traits>

#include "kernels/attention/attention_heads_as_rows.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/wgmma.cuh"

namespace kvp::attention {

// A chunk's K decoded to f16 (rotated domain), laid out as wgmma's K-major B operand in the
// 128-byte swizzle: 64-dim column blocks of kChunk rows of 128 bytes, 1024-byte aligned. Also
// what the ldmatrix reads of the other path want: eight rows' same 16-byte piece on eight banks.
template <int kHeadDim>
struct DecodedK {
  static constexpr int kBlockBytes = kChunk * wgmma::kSwizzleRowBytes;  // 64 dims of every row
  static constexpr int kBytes = kHeadDim / 64 * kBlockBytes;
  // Byte `byte` of row r. Rows 8 apart differ by 8 · 128 bytes whatever the byte.
  KVP_HD static int Byte(int r, int byte) {
    return byte / wgmma::kSwizzleRowBytes * kBlockBytes +
           wgmma::Swizzled128(r, byte % wgmma::kSwizzleRowBytes);
  }
  static constexpr int kRowStride = wgmma::kSwizzleRowBytes;
};

// A chunk's V decoded to f16 (rotated domain, without the layer's v_scale, as DecodeValuePair):
// kChunk rows of kHeadDim values. Row r's 16-byte piece k sits at piece k ^ (r & 7) ^ ((k >> 3)
// & 1): the eight rows of an ldmatrix read fall on different banks, and so do the stores of eight
// threads decoding pieces 2c (or 2c + 1) of one row, c = 0..7.
template <int kHeadDim>
struct DecodedV {
  static constexpr int kRowStride = 2 * kHeadDim;
  static constexpr int kBytes = kChunk * kRowStride;
  KVP_HD static int Byte(int r, int byte) {
    const int piece = byte >> 4;
    return r * kRowStride + ((piece ^ (r & 7) ^ ((piece >> 3) & 1)) << 4) + (byte & 15);
  }
};

// Shared memory: the stages, the position ring and the level pairs as for the other kernels, then
// the decoded K (after up to 1024 bytes of padding that align it) and V.
template <int kHeadDim, int kVBits>
inline constexpr int kDecodedOffset = kPairLevelsOffset<kHeadDim, kVBits, 1> + (4 << (2 * kVBits));
template <int kHeadDim, int kVBits>
inline constexpr int kDecodedEnd = kDecodedOffset<kHeadDim, kVBits> + wgmma::kSwizzleAtomBytes +
                                   DecodedK<kHeadDim>::kBytes + DecodedV<kHeadDim>::kBytes;
template <int kHeadDim, int kVBits>
inline constexpr int kDecodedSharedBytes = SharedBytesOf(kDecodedEnd<kHeadDim, kVBits>,
                                                         kFinishOutputsBytes<kHeadDim>);

// Decodes a staged chunk into k_out (DecodedK) and v_out (DecodedV), with all the CTA's threads:
// thread i takes the 16-dim piece i % (D/16) (16 K bytes, one TurboNV group) of every
// (kWarps·32·16/D)-th row from i / (D/16), so a quarter warp reads 128 contiguous staged bytes.
template <int kHeadDim, int kVBits>
__device__ __forceinline__ void DecodeChunk(const Stage<kHeadDim, kVBits, 1>& st,
                                            const __half2* pair_levels, uint8_t* k_out,
                                            uint8_t* v_out) {
  using St = Stage<kHeadDim, kVBits, 1>;
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
    using K = DecodedK<kHeadDim>;
    *reinterpret_cast<uint4*>(k_out + K::Byte(r, 32 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(k_out + K::Byte(r, 32 * c + 16)) = make_uint4(h[4], h[5], h[6], h[7]);
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
    using V = DecodedV<kHeadDim>;
    *reinterpret_cast<uint4*>(v_out + V::Byte(r, 32 * c)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(v_out + V::Byte(r, 32 * c + 16)) = make_uint4(h[4], h[5], h[6], h[7]);
  }
  wgmma::FenceSharedWrites();  // K is read by wgmma, through the async proxy
}

// Launched with two or four head tiles a CTA (WithPartsKernel): one or two warps a head tile.
template <int kHeadDim, int kVBits, bool kSparse>
__global__ void __launch_bounds__(kWarps * 32)
    HeadsAsRowsDecodedKernel(AttentionParams p, PositionSource src, Plan plan, float* parts) {
  using St = Stage<kHeadDim, kVBits, 1>;
  using K = DecodedK<kHeadDim>;
  using V = DecodedV<kHeadDim>;
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q·Kᵀ
  constexpr int kNTiles = kHeadDim / 8;  // n-tiles of P·V
  extern __shared__ __align__(16) uint8_t smem[];
  const __half2* pair_levels = StartPartsKernel<kHeadDim, kVBits, 1>(smem);
  uint8_t* k_rows = smem + kDecodedOffset<kHeadDim, kVBits>;
  k_rows += (wgmma::kSwizzleAtomBytes - bulk::SharedAddress(k_rows) % wgmma::kSwizzleAtomBytes) %
            wgmma::kSwizzleAtomBytes;
  uint8_t* v_rows = k_rows + K::kBytes;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t = lane % 4;
  const HeadTileOfWarp w = HeadTileOfWarp::Of(p, plan, warp);

  // Q's A fragments in dim order: k-step s takes dims 16s + 2t, + 1 (a0, a1) and 16s + 2t + 8, + 9.
  // Loaded here as bf16 pairs, converted once the first chunks' copies are issued.
  uint32_t q_loaded[kSteps][4];
  {
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(p.q + w.q_head0 * kHeadDim);
    const uint32_t* q1 = q0 + 8 * kHeadDim / 2;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int pair = 8 * s + t;  // bf16 pairs: dims 2·pair, 2·pair + 1
      q_loaded[s][0] = w.row0 ? q0[pair] : 0u;
      q_loaded[s][1] = w.row1 ? q1[pair] : 0u;
      q_loaded[s][2] = w.row0 ? q0[pair + 4] : 0u;
      q_loaded[s][3] = w.row1 ? q1[pair + 4] : 0u;
    }
  }
  uint32_t qa[kSteps][4];
  auto convert_queries = [&] {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[s][i] = mma::Bf16x2ToHalf2(q_loaded[s][i]);
    }
  };
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

  // Attention over kSpan decoded positions from `base` of the staged chunk. With kWarpgroup (a
  // span of the whole chunk, every warp of the CTA on its own head tile) S comes from wgmma: the
  // CTA's 64 heads are its M, the 64 positions its N, K is read from shared memory as it lies.
  auto Span = [&](auto span_positions, auto warpgroup, const St& st, int base) {
    constexpr int kSpan = decltype(span_positions)::value;
    constexpr bool kWarpgroup = decltype(warpgroup)::value;
    static_assert(!kWarpgroup || kSpan == 64);
    // Two accumulators an n-tile (even and odd k-steps) where a span of 32 leaves too few
    // independent mma chains; 64 positions have eight n-tiles, and registers for only one set.
    constexpr int kChains = kSpan < 64 ? 2 : 1;
    const uint8_t* k_span = k_rows + base * K::kRowStride;
    const uint8_t* v_span = v_rows + base * V::kRowStride;
    float s_acc[kChains][kSpan / 8][4] = {};  // S = Q·Kᵀ, 8 positions an n-tile
    if constexpr (kWarpgroup) {
      float d[32];
      const uint64_t k_descriptor = wgmma::SwizzledKMajorDescriptor(k_rows);
      wgmma::Fence();
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int offset = s / 4 * K::kBlockBytes + s % 4 * 32;  // 16 dims = 32 bytes a k-step
        wgmma::MmaM64N64K16(d, qa[s], wgmma::AdvancedDescriptor(k_descriptor, offset), s > 0);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::KeepAfterWait(d);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s_acc[0][j][i] = d[4 * j + i];
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
#pragma unroll
        for (int half = 0; half < kSpan / 16; ++half) {
          uint32_t b[4];
          mma::LoadMatrices(k_span + half * 16 * K::kRowStride + K::Byte(k_row, 32 * s + k_byte),
                            b);
          mma::MmaF16(s_acc[s % kChains][2 * half], qa[s], b[0], b[1]);
          mma::MmaF16(s_acc[s % kChains][2 * half + 1], qa[s], b[2], b[3]);
        }
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
    if (!TileSoftmax(s_acc[0], st.slots + base, qk_scale, w.row0, w.row1, tau,
                     w.real ? p.skipped_tiles : nullptr, m, l, acc, pa)) {
      return;
    }
#pragma unroll
    for (int j = 0; j < kNTiles; j += 2) {
#pragma unroll
      for (int half = 0; half < kSpan / 16; ++half) {
        uint32_t b[4];
        mma::LoadMatricesTransposed(
            v_span + half * 16 * V::kRowStride + V::Byte(v_row, 16 * j + v_byte), b);
        mma::MmaF16(acc[j], pa[half], b[0], b[1]);
        mma::MmaF16(acc[j + 1], pa[half], b[2], b[3]);
      }
    }
  };

  ChunkStream<kHeadDim, kVBits, kSparse, 1> stream(p, src, plan.splits, blockIdx.x, w.seq,
                                                   w.kv_head, smem);
  stream.ForEach(convert_queries, [&](const St& st) {
    DecodeChunk<kHeadDim, kVBits>(st, pair_levels, k_rows, v_rows);
    __syncthreads();  // every thread calls consume; the next chunk's barrier protects the rows
    // A warp takes its head tile's positions in spans: all 64 of the chunk at once when it is
    // the tile's only warp (a CTA of four head tiles) and the registers allow (D <= 128), else
    // 32 at a time. Longer spans give more independent mma and one softmax reduction for all
    // their positions.
    if constexpr (kHeadDim <= 128) {
      if (w.warps_per_tile == 1) {
        // wgmma takes the whole warpgroup: a warp of a padding head tile computes on zero
        // queries, and its rows are never written.
        Span(IntConstant<kChunk>{}, std::true_type{}, st, 0);
        return;
      }
    }
    if (!w.real) return;
    for (int base = w.sub * (kChunk / 2); base < kChunk; base += w.warps_per_tile * (kChunk / 2))
      Span(IntConstant<kChunk / 2>{}, std::false_type{}, st, base);
  });

  static_assert(kFinishOutputsBytes<kHeadDim> <= kDecodedSharedBytes<kHeadDim, kVBits>);
  FinishHeadTiles<kHeadDim, kNTiles, true>(
      p, plan, w, m, l, acc, [](int j, int column) { return 8 * j + column; }, smem, parts);
}

}  // namespace kvp::attention
