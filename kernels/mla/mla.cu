// The MLA cache write and the top-k slots (kernels/mla/mla_params.h).
//
// Cache write: a warp per token. Each lane takes four consecutive values of every tile, the warp
// reduces the tile's amax (exact in any order), and the codes come from the same integer E4M3
// encoder the host uses, so the bytes match MlaCacheWriteRef bit for bit (IEEE division,
// --fmad=false for this file).
//
// Top-k slots: a thread per selected position. Sparse decode is sparse_mla_decode.cu.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/cache_write/index_key_write.cuh"
#include "kernels/mla/mla_launch.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

constexpr int kWarp = 32;

// ---- Cache write ----

constexpr int kWriteWarps = 8;

// CTAs [0, latent_ctas) write latents, the rest the index keys (the cache write's own code).
__global__ void __launch_bounds__(kWriteWarps* kWarp)
    MlaCacheWriteKernel(MlaCacheWriteParams p, int latent_ctas) {
  if (static_cast<int>(blockIdx.x) >= latent_ctas) {
    WriteIndexKeys(p.cache, p.index_k, p.slots, p.num_tokens,
                   (blockIdx.x - latent_ctas) * blockDim.x + threadIdx.x);
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const int token = blockIdx.x * kWriteWarps + threadIdx.x / kWarp;
  if (token >= p.num_tokens) return;
  const int64_t slot = p.slots[token];
  if (slot < 0) return;
  uint8_t* out = p.cache.LatentOfSlot(slot);
  // Every load of the lane first (four 8-byte words of latent, one of RoPE), then the four tiles'
  // reductions side by side: nothing waits on a load another could have overlapped.
  const Bf16* latent = p.latent + int64_t{token} * p.latent_stride;
  const Bf16* rope = p.rope + int64_t{token} * p.rope_stride;
  uint2 raw[kMlaTiles];
#pragma unroll
  for (int t = 0; t < kMlaTiles; ++t) {
    raw[t] = *reinterpret_cast<const uint2*>(latent + t * kMlaTile + lane * 4);
  }
  const uint32_t rope_pair = *reinterpret_cast<const uint32_t*>(rope + 2 * lane);
  float x[kMlaTiles][4], amax[kMlaTiles];
#pragma unroll
  for (int t = 0; t < kMlaTiles; ++t) {
    x[t][0] = __uint_as_float(raw[t].x << 16);
    x[t][1] = __uint_as_float(raw[t].x & 0xFFFF0000u);
    x[t][2] = __uint_as_float(raw[t].y << 16);
    x[t][3] = __uint_as_float(raw[t].y & 0xFFFF0000u);
    amax[t] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) amax[t] = fmaxf(amax[t], fabsf(x[t][i]));  // NaN ignored
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) {
#pragma unroll
    for (int t = 0; t < kMlaTiles; ++t) amax[t] = fmaxf(amax[t], __shfl_xor_sync(~0u, amax[t], o));
  }
  float scale = 0.0f;  // lane t < 4 stores tile t's
#pragma unroll
  for (int t = 0; t < kMlaTiles; ++t) {
    float s = DivRn(amax[t], kE4m3Max);
    s = s > FLT_MIN ? s : FLT_MIN;
    if (lane == t) scale = s;
    uint32_t codes = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) codes |= uint32_t{MlaLatentCode(x[t][i], s)} << (8 * i);
    *reinterpret_cast<uint32_t*>(out + t * kMlaTile + lane * 4) = codes;
  }
  if (lane < kMlaTiles) *reinterpret_cast<float*>(out + kMlaScalesOffset + 4 * lane) = scale;
  // RoPE values are bf16 already: stored as they came (rounding a bf16 to bf16 is itself), except
  // that a NaN is made quiet, as the reference's Bf16FromFloat does.
  uint32_t stored = rope_pair;
  if ((rope_pair & 0x7FFFu) > 0x7F80u) stored |= 0x40u;
  if (((rope_pair >> 16) & 0x7FFFu) > 0x7F80u) stored |= 0x400000u;
  *reinterpret_cast<uint32_t*>(out + kMlaRopeOffset + 4 * lane) = stored;
}

// ---- Top-k positions to slots ----

__global__ void SlotsOfPositionsKernel(SlotsOfPositionsParams p) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.rows} * p.k) return;
  const int32_t pos = p.positions[i];
  const int32_t* table = p.block_tables + (i / p.k) * p.block_table_stride;
  p.slots[i] = pos < 0 ? -1 : static_cast<int32_t>(SlotOfPosition(table, pos, p.block_size));
}

}  // namespace

LaunchStatus MlaCacheWriteLaunch(const MlaCacheWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return {};
  if (p.latent_stride % 4 != 0 || p.rope_stride % 2 != 0 ||
      reinterpret_cast<uintptr_t>(p.latent) % 8 != 0 || reinterpret_cast<uintptr_t>(p.rope) % 4 != 0) {
    return Unsupported("MLA cache write rows not 8-byte (latent) and 4-byte (RoPE) aligned");
  }
  constexpr int kThreads = kWriteWarps * kWarp;
  const int latent_ctas = (p.num_tokens + kWriteWarps - 1) / kWriteWarps;
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
  SlotsOfPositionsKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                           stream>>>(p);
  return LastLaunchError();
}

}  // namespace kvp
