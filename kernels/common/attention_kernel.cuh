// The attention core shared by dense paged decode and sparse decode on the GPU: flash-decoding
// over FP8 K and TurboNV V with tensor cores, in two kernels. The first writes partial results
// per (q head, split of the positions) with one of two layouts of the heads in the mma fragments
// (attention_heads_as_columns.cuh for at most 8 q heads per kv head, attention_heads_as_rows.cuh
// for more); the second merges the parts of each q head, applies the inverse Walsh-Hadamard
// rotation once and writes the output. When a heads-as-columns CTA is its heads' only part (a
// batch large enough to fill the GPU without splitting), it writes their outputs itself and the
// second kernel is not launched. This file picks the kernel, sizes the split and launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_heads_as_columns.cuh"
#include "kernels/common/attention_heads_as_rows.cuh"
#include "kernels/common/attention_pipeline.cuh"
#include "kernels/common/launch_status.h"

namespace kvp::attention {

// Block-wide reduction of one float per thread with `op`; every thread gets the result. `scratch`
// holds one float per warp.
template <class Op>
__device__ float BlockReduce(float v, float* scratch, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < warps; ++w) v = op(v, scratch[w]);
  return v;
}

// Parts above which the combining kernel spreads them over 4 threads per element.
inline constexpr int kManyParts = 16;

// Merges the parts of one (sequence, q head), rotates back and writes out. Block: D × kLanes
// threads. kLanes = 1 (few parts): every thread reads all maxima and sums. kLanes = 4 (many
// parts, batch 1): the maxima and sums are read by all threads at once into shared memory
// (dynamic: one float per part), and lane l of element e sums parts l, l + 4, ...: a few
// dependent loads instead of one per part.
template <int kHeadDim, int kLanes>
__global__ void __launch_bounds__(kHeadDim* kLanes)
    AttentionCombineKernel(AttentionParams p, int parts_n, const float* parts) {
  constexpr int kRow = kRowFloats<kHeadDim>;
  __shared__ float x[kHeadDim];
  const int e = threadIdx.x % kHeadDim, lane = threadIdx.x / kHeadDim;
  const int qh = blockIdx.x, seq = blockIdx.y;
  const float* base = parts + (int64_t{seq} * p.num_q_heads + qh) * parts_n * kRow;
  float sum = 0.0f, o = 0.0f;
  if constexpr (kLanes == 1) {
    float max_m = -INFINITY;
#pragma unroll 8
    for (int i = 0; i < parts_n; ++i) max_m = fmaxf(max_m, base[i * kRow]);
    if (max_m != -INFINITY) {
#pragma unroll 8
      for (int i = 0; i < parts_n; ++i) {
        const float w = exp2f(base[i * kRow] - max_m);
        sum += w * base[i * kRow + 1];
        o += w * base[i * kRow + 2 + e];
      }
    }
  } else {
    extern __shared__ float weights[];  // [parts_n]
    __shared__ float scratch[kHeadDim * kLanes / 32];
    __shared__ float lane_sums[kLanes][kHeadDim];
    float max_m = -INFINITY;
    for (int i = threadIdx.x; i < parts_n; i += blockDim.x) max_m = fmaxf(max_m, base[i * kRow]);
    max_m = BlockReduce(max_m, scratch, [](float a, float b) { return fmaxf(a, b); });
    for (int i = threadIdx.x; i < parts_n; i += blockDim.x) {
      const float w = max_m == -INFINITY ? 0.0f : exp2f(base[i * kRow] - max_m);
      weights[i] = w;
      sum += w * base[i * kRow + 1];
    }
    sum = BlockReduce(sum, scratch, [](float a, float b) { return a + b; });  // weights are ready
#pragma unroll 8
    for (int i = lane; i < parts_n; i += kLanes) o += weights[i] * base[i * kRow + 2 + e];
    lane_sums[lane][e] = o;
    __syncthreads();
    o = 0.0f;
#pragma unroll
    for (int l = 0; l < kLanes; ++l) o += lane_sums[l][e];
  }
  if (lane == 0) x[e] = Normalized(o, sum, p);
  __syncthreads();
  RotateBackAndWrite<kHeadDim>(x, 1, p, int64_t{seq} * p.num_q_heads + qh);
}

// One parts kernel with what its launch needs: set up once per instantiation (shared-memory
// opt-in, and how many of its CTAs fit on one SM).
struct PartsKernel {
  void (*kernel)(AttentionParams, PositionSource, Plan, float*) = nullptr;
  int shared_bytes = 0;
  bool heads_as_columns = false;
  int resident = 0;  // CTAs per SM
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
    k.setup =
        cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, k.shared_bytes);
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
    const dim3 heads(p.num_q_heads, p.num_seqs);
    if (plan.parts() == 1 && k.heads_as_columns) {
      // The parts kernel wrote the outputs itself.
    } else if (plan.parts() <= kManyParts) {
      AttentionCombineKernel<kD, 1><<<heads, kD, 0, stream>>>(p, plan.parts(), parts);
    } else {
      AttentionCombineKernel<kD, 4>
          <<<heads, kD * 4, plan.parts() * sizeof(float), stream>>>(p, plan.parts(), parts);
    }
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
