// The attention core shared by dense paged decode and sparse decode on the GPU: flash-decoding
// over FP8 K and TurboNV V with tensor cores, in two kernels. The first writes partial results
// per (q head, split of the positions) with one of two layouts of the heads in the mma fragments
// (attention_heads_as_columns.cuh for at most 8 q heads per kv head, attention_heads_as_rows.cuh
// for more); the second merges the parts of each q head, applies the inverse Walsh-Hadamard
// rotation once and writes the output. This file picks the kernel, sizes the split and launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_heads_as_columns.cuh"
#include "kernels/common/attention_heads_as_rows.cuh"
#include "kernels/common/attention_pipeline.cuh"
#include "kernels/common/launch_status.h"

namespace kvp::attention {

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

// One parts kernel with what its launch needs: set up once per instantiation (shared-memory
// opt-in, and how many of its CTAs fit on one SM).
struct PartsKernel {
  void (*kernel)(AttentionParams, PositionSource, Plan, float*) = nullptr;
  int shared_bytes = 0;
  bool heads_as_columns = false;
  int resident = 0;    // CTAs per SM
  cudaError_t setup = cudaSuccess;
};

template <int kHeadDim, int kVBits, bool kSparse, bool kColumns>
const PartsKernel& PartsKernelFor() {
  static const PartsKernel k = [] {
    PartsKernel k;
    k.kernel = kColumns ? HeadsAsColumnsKernel<kHeadDim, kVBits, kSparse>
                        : HeadsAsRowsKernel<kHeadDim, kVBits, kSparse>;
    k.shared_bytes = kSharedBytes<kHeadDim, kVBits>;
    k.heads_as_columns = kColumns;
    k.setup = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   k.shared_bytes);
    if (k.setup == cudaSuccess) {
      k.setup = cudaFuncSetAttribute(k.kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared);
    }
    if (k.setup == cudaSuccess) {
      k.setup = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.resident, k.kernel, kWarps * 32,
                                                              k.shared_bytes);
    }
    if (k.resident < 1) k.resident = 1;
    return k;
  }();
  return k;
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

// Calls f(kernel, IntConstant<head_dim>) for the kernel that serves p, or names what is missing.
template <bool kSparse, class F>
LaunchStatus WithPartsKernel(const AttentionParams& p, F&& f) {
  const LayerCache& c = p.cache;
  if (c.k_codec.format != KvFormat::kFp8E4m3) return Unsupported("K formats other than fp8_e4m3");
  if (c.block_stride > INT32_MAX) return Unsupported("blocks of 2 GiB or more");  // ChunkStream
  const bool columns = p.num_q_heads / c.num_kv_heads <= kMaxColumnHeads;
  auto with_bits = [&](auto head_dim, auto bits) -> LaunchStatus {
    constexpr int kD = decltype(head_dim)::value, kBits = decltype(bits)::value;
    return columns ? f(PartsKernelFor<kD, kBits, kSparse, true>(), head_dim)
                   : f(PartsKernelFor<kD, kBits, kSparse, false>(), head_dim);
  };
  auto with_dim = [&](auto head_dim) -> LaunchStatus {
    switch (c.v_codec.format) {
      case KvFormat::kTurbo2:
        return with_bits(head_dim, IntConstant<2>{});
      case KvFormat::kTurbo3:
        return with_bits(head_dim, IntConstant<3>{});
      case KvFormat::kTurbo4:
        return with_bits(head_dim, IntConstant<4>{});
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

// The full plan of a launch. `positions` bounds a sequence's positions (max_seq_len, or topk).
inline Plan PlanFor(const AttentionParams& p, const PartsKernel& k, int positions) {
  Plan plan = k.heads_as_columns ? HeadsAsColumnsPlan() : HeadsAsRowsPlan(p);
  const int chunks = (positions + kChunk - 1) / kChunk;
  const int base = p.num_seqs * p.cache.num_kv_heads * plan.ctas_per_kv_head();
  plan.splits = ChooseSplits(base, chunks, k.resident * SmCount());
  return plan;
}

template <bool kSparse>
LaunchStatus LaunchAttention(const AttentionParams& p, const PositionSource& src, int positions,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return WithPartsKernel<kSparse>(p, [&](const PartsKernel& k, auto head_dim) -> LaunchStatus {
    constexpr int kD = decltype(head_dim)::value;
    if (k.setup != cudaSuccess) return LaunchStatus{k.setup, nullptr};
    if (p.num_seqs == 0) return {};
    Plan plan = PlanFor(p, k, positions);
    if (workspace_bytes < PartialBytes(p, plan)) {
      return LaunchStatus{cudaErrorInvalidValue, nullptr};
    }
    float* parts = static_cast<float*>(workspace);
    const dim3 grid(plan.splits, p.cache.num_kv_heads * plan.ctas_per_kv_head(), p.num_seqs);
    k.kernel<<<grid, kWarps * 32, k.shared_bytes, stream>>>(p, src, plan, parts);
    AttentionCombineKernel<kD>
        <<<dim3(p.num_q_heads, p.num_seqs), kD, 0, stream>>>(p, plan.parts(), parts);
    return LastLaunchError();
  });
}

template <bool kSparse>
size_t AttentionWorkspaceBytes(const AttentionParams& p, int positions) {
  size_t bytes = 0;
  WithPartsKernel<kSparse>(p, [&](const PartsKernel& k, auto) -> LaunchStatus {
    bytes = PartialBytes(p, PlanFor(p, k, positions));
    return {};
  });
  return bytes;
}

}  // namespace kvp::attention
