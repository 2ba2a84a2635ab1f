// The MLA cache write and the top-k slots (kernels/mla/mla_params.h).
//
// Cache write: a warp per two tokens. Each lane takes 16 consecutive values of one tile, eight
// lanes reduce the tile's amax (exact in any order), divide by the scale without a division per value
// (MlaQuotient, the same quotients where the code depends on them) and convert two values at a
// time with the hardware converter snapped as E4m3FromFloat does, so the bytes match
// MlaCacheWriteRef bit for bit (--fmad=false for this file).
//
// Top-k slots: a thread per selected position. Sparse decode is sparse_mla_decode.cu.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/cache_write/index_key_write.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/mla/mla_launch.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

constexpr int kWarp = 32;

// ---- Cache write ----

constexpr int kWriteWarps = 8;
constexpr int kValuesPerLane = kMlaLatentDim / kWarp;      // 16
constexpr int kLanesPerTile = kMlaTile / kValuesPerLane;   // 8
constexpr int kRopeLanes = kMlaRopeDim / 8;                // 8 bf16 values a lane
static_assert(kValuesPerLane == 16 && kLanesPerTile == 8 && kRopeLanes == 8);
constexpr int kTokensPerWarp = 2;

// One lane's share of a token: latent values [16 l, 16 l + 16) (tile l / 8) and, below lane 8,
// RoPE values [8 l, 8 l + 8): 16-byte loads and stores, and a tile's amax in three shuffles.
struct LaneInputs {
  uint4 lo, hi, rope;
};

__device__ __forceinline__ LaneInputs LoadLane(const MlaCacheWriteParams& p, int token, int lane) {
  const Bf16* latent = p.latent + int64_t{token} * p.latent_stride + kValuesPerLane * lane;
  LaneInputs in{.lo = *reinterpret_cast<const uint4*>(latent),
                .hi = *reinterpret_cast<const uint4*>(latent + 8),
                .rope = make_uint4(0, 0, 0, 0)};
  if (lane < kRopeLanes) {
    in.rope = *reinterpret_cast<const uint4*>(p.rope + int64_t{token} * p.rope_stride + 8 * lane);
  }
  return in;
}

// Encodes one token's 656 bytes at `out`. The whole warp calls it (shuffles).
__device__ __forceinline__ void EncodeLane(const LaneInputs& in, uint8_t* out, int lane) {
  const uint32_t words[8] = {in.lo.x, in.lo.y, in.lo.z, in.lo.w,
                             in.hi.x, in.hi.y, in.hi.z, in.hi.w};
  float x[kValuesPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    x[2 * w] = __uint_as_float(words[w] << 16);
    x[2 * w + 1] = __uint_as_float(words[w] & 0xFFFF0000u);
    amax = fmaxf(amax, fmaxf(fabsf(x[2 * w]), fabsf(x[2 * w + 1])));  // NaN ignored
  }
#pragma unroll
  for (int o = kLanesPerTile / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
  float s = DivRn(amax, kE4m3Max);
  s = s > FLT_MIN ? s : FLT_MIN;
  // One reciprocal a tile and two fma a value instead of a division (MlaQuotient: the same
  // codes), unless the scale is out of its range (the same branch for a tile's eight lanes).
  float q[kValuesPerLane];
  if (s >= kMlaQuotientMinScale && s <= FLT_MAX) {
    const float r = MlaReciprocal(s);
#pragma unroll
    for (int i = 0; i < kValuesPerLane; ++i) q[i] = MlaQuotient(x[i], s, r);
  } else {
#pragma unroll
    for (int i = 0; i < kValuesPerLane; ++i) q[i] = DivRn(x[i], s);
  }
  // Two values a conversion; NaN becomes 0x7F, as MlaLatentCode has it.
  uint32_t codes[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    codes[c] = E4m3x2FromFloat(q[4 * c], q[4 * c + 1]) |
               (E4m3x2FromFloat(q[4 * c + 2], q[4 * c + 3]) << 16);
  }
  *reinterpret_cast<uint4*>(out + kValuesPerLane * lane) =
      make_uint4(codes[0], codes[1], codes[2], codes[3]);
  // The four scales, from the first lane of each tile, in one store.
  float scales[kMlaTiles];
#pragma unroll
  for (int t = 0; t < kMlaTiles; ++t) scales[t] = __shfl_sync(~0u, s, t * kLanesPerTile);
  if (lane == 0) {
    *reinterpret_cast<float4*>(out + kMlaScalesOffset) =
        make_float4(scales[0], scales[1], scales[2], scales[3]);
  }
  // RoPE values are bf16 already: stored as they came (rounding a bf16 to bf16 is itself), except
  // that a NaN is made quiet, as the reference's Bf16FromFloat does.
  if (lane < kRopeLanes) {
    uint32_t r[4] = {in.rope.x, in.rope.y, in.rope.z, in.rope.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if ((r[w] & 0x7FFFu) > 0x7F80u) r[w] |= 0x40u;
      if (((r[w] >> 16) & 0x7FFFu) > 0x7F80u) r[w] |= 0x400000u;
    }
    *reinterpret_cast<uint4*>(out + kMlaRopeOffset + 16 * lane) =
        make_uint4(r[0], r[1], r[2], r[3]);
  }
}

// CTAs [0, latent_ctas) write latents, kTokensPerWarp tokens a warp, every load of them issued
// before the first is encoded; the rest write the index keys (the cache write's own code).
__global__ void __launch_bounds__(kWriteWarps* kWarp)
    MlaCacheWriteKernel(MlaCacheWriteParams p, int latent_ctas) {
  if (static_cast<int>(blockIdx.x) >= latent_ctas) {
    WriteIndexKeys(p.cache, p.index_k, p.slots, p.num_tokens,
                   (blockIdx.x - latent_ctas) * blockDim.x + threadIdx.x);
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const int first = (blockIdx.x * kWriteWarps + threadIdx.x / kWarp) * kTokensPerWarp;
  LaneInputs in[kTokensPerWarp];
  int64_t slots[kTokensPerWarp];
#pragma unroll
  for (int k = 0; k < kTokensPerWarp; ++k) {
    const int token = first + k;
    slots[k] = token < p.num_tokens ? p.slots[token] : -1;
    if (token < p.num_tokens) in[k] = LoadLane(p, token, lane);
  }
#pragma unroll
  for (int k = 0; k < kTokensPerWarp; ++k) {
    if (slots[k] >= 0) EncodeLane(in[k], p.cache.LatentOfSlot(slots[k]), lane);  // warp-uniform
  }
}

// ---- Top-k positions to slots ----

__global__ void SlotsOfPositionsKernel(SlotsOfPositionsParams p) {
  LetDependentsLaunch();
  WaitForPredecessor();  // the positions (the top-k), and the slots the kernel before may read
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.rows} * p.k) return;
  const int32_t pos = p.positions[i];
  const int32_t* table = p.block_tables + (i / p.k) * p.block_table_stride;
  p.slots[i] = pos < 0 ? -1 : static_cast<int32_t>(SlotOfPosition(table, pos, p.block_size));
}

}  // namespace

LaunchStatus MlaCacheWriteLaunch(const MlaCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return {};
  if (p.latent_stride % 8 != 0 || p.rope_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.latent) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.rope) % 16 != 0) {
    return Unsupported("MLA cache write rows (latent and RoPE) not 16-byte aligned");
  }
  constexpr int kThreads = kWriteWarps * kWarp;
  constexpr int kTokensPerCta = kWriteWarps * kTokensPerWarp;
  const int latent_ctas = (p.num_tokens + kTokensPerCta - 1) / kTokensPerCta;
  const int64_t index_ctas =
      p.cache.has_indexer ? (int64_t{p.num_tokens} * kIndexThreads + kThreads - 1) / kThreads : 0;
  MlaCacheWriteKernel<<<static_cast<unsigned>(latent_ctas + index_ctas), kThreads, 0, stream>>>(
      p, latent_ctas);
  return LastLaunchError();
}

LaunchStatus SlotsOfPositionsLaunch(const SlotsOfPositionsParams& p, cudaStream_t stream) {
  const int64_t n = int64_t{p.rows} * p.k;
  if (n <= 0) return {};
  constexpr int kThreads = 256;
  return LaunchStatus{LaunchDependent(SlotsOfPositionsKernel,
                                      dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)),
                                      dim3(kThreads), 0, stream, false, p),
                      nullptr};
}

}  // namespace kvp
