// The attention core shared by dense paged decode and sparse decode on the GPU: flash-decoding
// over FP8 K and TurboNV V with tensor cores, in two kernels. The first writes partial results
// per (q head, split of the positions) with one of two layouts of the heads in the mma fragments
// (attention_heads_as_columns.cuh for at most 8 q heads per kv head, attention_heads_as_rows.cuh
// for more, and attention_heads_as_rows_decoded.cuh when a CTA covers several head tiles); the
// second merges the parts of each q head, applies the inverse Walsh-Hadamard rotation once and
// writes the output. When a CTA is its heads' only part (a batch large enough to fill the GPU
// without splitting), it writes their outputs itself and the second kernel is not launched (all
// but the plain heads-as-rows kernel, whose shared memory is too small for it). This file picks
// the kernel, sizes the split and launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/capabilities.h"
#include "kernels/attention/attention_heads_as_columns.cuh"
#include "kernels/attention/attention_heads_as_rows.cuh"
#include "kernels/attention/attention_heads_as_rows_decoded.cuh"
#include "kernels/attention/attention_pipeline.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/launch_status.h"

namespace kvp::attention {

// a[0..n) = p[0..n), read 16 bytes at a time where n allows (p is aligned to that).
template <int n>
__device__ __forceinline__ void LoadFloats(const float* p, float (&a)[n]) {
  if constexpr (n % 4 == 0) {
#pragma unroll
    for (int j = 0; j < n; j += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + j);
      a[j] = v.x, a[j + 1] = v.y, a[j + 2] = v.z, a[j + 3] = v.w;
    }
  } else {
    static_assert(n == 2);
    const float2 v = *reinterpret_cast<const float2*>(p);
    a[0] = v.x, a[1] = v.y;
  }
}

// The combining kernel: one CTA of CombineWarps(parts) warps per (sequence, q head). Where a q
// head has many parts (128 for dense decode of one 131,072-token sequence), more warps each merge
// fewer, so fewer of a warp's batches of loads wait one after another (eight and sixteen warps
// were faster than four at batch 1, thirty-two no faster: bench/NOTES.md, sparse decode). Where a
// head has few parts (two, in a decode step of 64 sequences) the extra warps have nothing to
// merge, and four stay.
inline int CombineWarps(int parts) { return parts >= 32 ? 16 : parts >= 16 ? 8 : 4; }

// Parts a warp of the combining kernel loads before it merges them: all of its parts (a power of
// two, at most 8), so that a warp with a few parts waits on memory once. (A loop unrolled eight
// times left a warp's parts short of eight to a remainder loop that loads one part and merges it
// before the next, which made the batch-1 decodes measurably slower.)
inline int CombineBatch(int parts, int warps) {
  const int per_warp = (parts + warps - 1) / warps;
  return per_warp > 4 ? 8 : per_warp > 2 ? 4 : per_warp > 1 ? 2 : 1;
}

// Merges the parts of one (sequence, q head), rotates back and writes out. Lane l of every warp
// owns elements [l·kPer, l·kPer + kPer). Warp w merges parts w, w + kCombineWarps, ... kBatch at
// a time: it loads them, then folds them into its running maximum, sum and elements. Past one
// barrier thread e merges element e of the warps' sums, and past another warp 0 applies the
// inverse Walsh-Hadamard rotation in registers and writes. (Warp 0 merging every element as well
// left the other warps idle after the barrier, slower at batch 1.)
template <int kHeadDim, int kCombineWarps, int kBatch>
__global__ void __launch_bounds__(kCombineWarps * 32)
    AttentionCombineKernel(AttentionParams p, int parts_n, const float* parts) {
  constexpr int kRow = kRowFloats<kHeadDim>;
  constexpr int kPer = kHeadDim / 32;  // 2, 4 or 8 elements a lane
  __shared__ float warp_x[kCombineWarps][kHeadDim];
  __shared__ float warp_max[kCombineWarps], warp_sum[kCombineWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t head = int64_t{blockIdx.y} * p.num_q_heads + blockIdx.x;
  LetDependentsLaunch();
  WaitForPredecessor();  // the parts
  const float* base = parts + head * parts_n * kRow;
  float max_m = -INFINITY, sum = 0.0f, x[kPer] = {};
  for (int first = warp; first < parts_n; first += kBatch * kCombineWarps) {
    float2 ms[kBatch];  // (max, sum); a missing part has max -inf and weight 0
    float a[kBatch][kPer];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = first + b * kCombineWarps;
      ms[b] = make_float2(-INFINITY, 0.0f);
#pragma unroll
      for (int j = 0; j < kPer; ++j) a[b][j] = 0.0f;
      if (i < parts_n) {
        const float* row = base + i * kRow;
        ms[b] = *reinterpret_cast<const float2*>(row);
        LoadFloats<kPer>(row + kAccOffset + lane * kPer, a[b]);
      }
    }
    float new_max = max_m;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) new_max = fmaxf(new_max, ms[b].x);
    // A part with no positions has max -inf; until one has some, everything stays 0.
    const float ref = new_max == -INFINITY ? 0.0f : new_max;
    const float keep = exp2f(max_m - ref);
    sum *= keep;
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] *= keep;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const float w = exp2f(ms[b].x - ref);
      sum += w * ms[b].y;
#pragma unroll
      for (int j = 0; j < kPer; ++j) x[j] += w * a[b][j];
    }
    max_m = new_max;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) warp_x[warp][lane * kPer + j] = x[j];
  if (lane == 0) {
    warp_max[warp] = max_m;
    warp_sum[warp] = sum;
  }
  __syncthreads();
  // Thread e merges element e of the warps' sums and leaves the normalized result in warp_x[0][e]
  // (no other thread reads element e).
  for (int e = threadIdx.x; e < kHeadDim; e += blockDim.x) {
    float all_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) all_max = fmaxf(all_max, warp_max[w]);
    const float ref = all_max == -INFINITY ? 0.0f : all_max;
    float all_sum = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) {
      const float scale = exp2f(warp_max[w] - ref);
      all_sum += scale * warp_sum[w];
      o += scale * warp_x[w][e];
    }
    warp_x[0][e] = Normalized(o, all_sum, p);
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kPer; ++j) x[j] = warp_x[0][lane * kPer + j];
  RotateBackAndWriteHead<kHeadDim>(x, p, head);
}

// Where a parts kernel puts the q heads: as the columns of its fragments (of one cache head, or of
// two paired cache heads of 64 dims), as their rows with each warp decoding its own K and V
// fragments, or as rows of CTAs that decode each chunk once for their several head tiles.
enum class HeadLayout {
  kColumns,
  kColumnsPairedHeads,
  kRows,
  kRowsSharedQueries,
  kRowsDecodedOnce
};
constexpr bool IsColumns(HeadLayout layout) {
  return layout == HeadLayout::kColumns || layout == HeadLayout::kColumnsPairedHeads;
}

// Whether p's kv heads run paired (HeadsAsColumnsKernel's kPairedHeads): head_dim 64, an even
// count, at most 4 q heads each, and each row of the cache's sections a pair's head of 128 dims:
// a CTA then reads rows of 128 dims as at head_dim 128 (bench/NOTES.md, other dense decode
// shapes).
inline bool PairsHeads(const AttentionParams& p) {
  const LayerCache& c = p.cache;
  const FormatTraits v = TraitsOf(c.v_codec.format);
  return c.head_dim == 64 && c.num_kv_heads % 2 == 0 &&
         p.num_q_heads / c.num_kv_heads <= kMaxColumnHeads / 2 && 2 * c.k_head_bytes == 128 &&
         2 * c.v_data_head_bytes == v.DataBytes(128) &&
         2 * c.v_scale_head_bytes == v.ScaleBytes(128);
}

// p as the paired kernel sees it: each pair of cache heads one kv head of 128 dims.
inline AttentionParams PairedHeadsParams(const AttentionParams& p) {
  AttentionParams paired = p;
  LayerCache& c = paired.cache;
  c.num_kv_heads /= 2;
  c.head_dim *= 2;
  c.k_head_bytes *= 2;
  c.v_data_head_bytes *= 2;
  c.v_scale_head_bytes *= 2;
  return paired;
}

// One parts kernel with what its launch needs: set up once per instantiation (shared-memory
// opt-in, and how many of its CTAs fit on one SM).
struct PartsKernel {
  void (*kernel)(AttentionParams, PositionSource, Plan, float*) = nullptr;
  int shared_bytes = 0;
  HeadLayout layout = HeadLayout::kColumns;
  int kv_heads_per_cta = 1;
  int chunk_positions = 0;  // positions of a staged chunk
  int resident = 0;         // CTAs per SM
  cudaError_t setup = cudaSuccess;
  bool columns() const { return IsColumns(layout); }
  // Whether a CTA that is its heads' only part writes their outputs (the plain heads-as-rows
  // kernel's shared memory holds no room for them).
  bool finishes_single_parts() const { return columns() || layout == HeadLayout::kRowsDecodedOnce; }
  // The parameters its launch takes for p.
  AttentionParams ParamsFor(const AttentionParams& p) const {
    return layout == HeadLayout::kColumnsPairedHeads ? PairedHeadsParams(p) : p;
  }
};

template <int kHeadDim, int kVBits, bool kSparse, HeadLayout kLayout, int kKvHeads>
const PartsKernel& PartsKernelFor() {
  constexpr bool kColumns = IsColumns(kLayout);
  static_assert(kColumns || kKvHeads == 1);
  static const PartsKernel k = [] {
    PartsKernel k;
    if constexpr (kColumns) {
      k.kernel = HeadsAsColumnsKernel<kHeadDim, kVBits, kSparse, kKvHeads,
                                      kLayout == HeadLayout::kColumnsPairedHeads>;
      k.shared_bytes = kColumnSharedBytes<kHeadDim, kVBits, kKvHeads>;
      k.chunk_positions = kColumnPositions<kHeadDim, kVBits, kKvHeads>;
    } else if constexpr (kLayout == HeadLayout::kRows ||
                         kLayout == HeadLayout::kRowsSharedQueries) {
      constexpr bool kShared = kLayout == HeadLayout::kRowsSharedQueries;
      if constexpr (kShared) {
        k.kernel = HeadsAsRowsSharedQueriesKernel<kHeadDim, kVBits, kSparse>;
      } else {
        k.kernel = HeadsAsRowsKernel<kHeadDim, kVBits, kSparse>;
      }
      k.shared_bytes = kRowsSharedBytes<kHeadDim, kVBits, kShared>;
      k.chunk_positions = kChunk;
    } else {
      k.kernel = HeadsAsRowsDecodedKernel<kHeadDim, kVBits, kSparse>;
      k.shared_bytes = kDecodedSharedBytes<kHeadDim, kVBits>;
      k.chunk_positions = kChunk;
    }
    k.layout = kLayout;
    k.kv_heads_per_cta = kKvHeads;
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

// The full plan of a launch. `positions` bounds a sequence's positions (max_seq_len, or topk); p
// as the kernel sees it (PartsKernel::ParamsFor).
inline Plan PlanFor(const AttentionParams& p, const PartsKernel& k, int positions) {
  Plan plan = k.columns() ? HeadsAsColumnsPlan(k.kv_heads_per_cta) : HeadsAsRowsPlan(p);
  const int chunks = (positions + k.chunk_positions - 1) / k.chunk_positions;
  plan.chunks = chunks;
  // A CTA covering several head tiles stages each K/V chunk once for all of them; but when even
  // one chunk a CTA would leave SMs idle (a batch of one with 128 heads a kv head), CTAs of fewer
  // head tiles spread the work.
  while (plan.tiles_per_cta > 1 &&
         int64_t{p.num_seqs} * plan.ctas_per_split(p.cache.num_kv_heads) * chunks < SmCount()) {
    plan.tiles_per_cta /= 2;
  }
  const int base = p.num_seqs * plan.ctas_per_split(p.cache.num_kv_heads);
  plan.splits = ChooseSplits(base, chunks, k.resident * SmCount());
  return plan;
}

// Positions a heads-as-columns CTA of two kv heads must get, or it covers one. Two kv heads a CTA
// read each position's pair of rows as one (fewer L2 requests per byte), but a launch of few
// sequences then has half the CTAs a kv head, each with more positions, which is slower when a
// CTA would get fewer than this (sparse decode at batch 1). Four kv heads a CTA measured slower
// than two everywhere (bench/NOTES.md, sparse decode).
inline constexpr int kMinPositionsForTwoKvHeads = 128;

template <HeadLayout kLayout>
using LayoutConstant = std::integral_constant<HeadLayout, kLayout>;

// Calls f(kernel, its plan, IntConstant<head_dim>) for the kernel that serves p, or names what is
// missing; the kernel's launch takes kernel.ParamsFor(p). `positions` bounds a sequence's
// positions (max_seq_len, or topk).
template <bool kSparse, class F>
LaunchStatus WithPartsKernel(const AttentionParams& p, int positions, F&& f) {
  const LayerCache& c = p.cache;
  // What the switches below instantiate, as kernels/capabilities.h declares it to workers.
  constexpr OpCapabilities kServed = kCudaCapabilities.attention;
  if (!kServed.k_formats.Has(c.k_codec.format)) return Unsupported("K formats other than fp8_e4m3");
  if (!kServed.v_formats.Has(c.v_codec.format)) return Unsupported("V formats other than turbo2/3/4");
  if (!kServed.HasHeadDim(c.head_dim)) return Unsupported("this head_dim");
  if (c.block_stride > INT32_MAX) return Unsupported("blocks of 2 GiB or more");  // ChunkStream
  const bool columns = p.num_q_heads / c.num_kv_heads <= kMaxColumnHeads;
  auto with_bits = [&](auto head_dim, auto bits) -> LaunchStatus {
    constexpr int kD = decltype(head_dim)::value, kBits = decltype(bits)::value;
    if (!columns && HeadsAsRowsPlan(p).head_tiles > 1) {
      const PartsKernel& decoded =
          PartsKernelFor<kD, kBits, kSparse, HeadLayout::kRowsDecodedOnce, 1>();
      const Plan plan = PlanFor(p, decoded, positions);
      if (plan.tiles_per_cta > 1) return f(decoded, plan, head_dim);
      // A launch too small to fill the GPU with CTAs of several head tiles (one sequence): each
      // warp decoding its own fragments is faster than decoding once for the CTA's head tiles
      // (sparse decode of 128 q heads at batch 1).
    }
    if (!columns) {
      const PartsKernel& rows = PartsKernelFor<kD, kBits, kSparse, HeadLayout::kRows, 1>();
      if constexpr (kD <= 128) {  // at D = 256 two CTAs fit an SM either way
        const PartsKernel& shared =
            PartsKernelFor<kD, kBits, kSparse, HeadLayout::kRowsSharedQueries, 1>();
        const Plan plan = PlanFor(p, shared, positions);
        if (shared.setup == cudaSuccess && shared.resident > rows.resident &&
            (plan.chunks + plan.splits - 1) / plan.splits >= kMinChunksForSharedQueries) {
          return f(shared, plan, head_dim);
        }
      }
      return f(rows, PlanFor(p, rows, positions), head_dim);
    }
    // Heads as columns, at the kernel's head dim and layout, for p as that kernel sees it (kp).
    auto with_columns = [&](auto kernel_dim, auto layout, const AttentionParams& kp) {
      constexpr int kKernelD = decltype(kernel_dim)::value;
      constexpr HeadLayout kLayout = decltype(layout)::value;
      if (kp.cache.num_kv_heads % 2 == 0) {
        const PartsKernel& two = PartsKernelFor<kKernelD, kBits, kSparse, kLayout, 2>();
        const Plan plan = PlanFor(kp, two, positions);
        if ((plan.chunks + plan.splits - 1) / plan.splits * two.chunk_positions >=
            kMinPositionsForTwoKvHeads) {
          return f(two, plan, head_dim);
        }
      }
      const PartsKernel& one = PartsKernelFor<kKernelD, kBits, kSparse, kLayout, 1>();
      return f(one, PlanFor(kp, one, positions), head_dim);
    };
    if constexpr (kD == 64) {
      if (PairsHeads(p)) {
        return with_columns(IntConstant<128>{}, LayoutConstant<HeadLayout::kColumnsPairedHeads>{},
                            PairedHeadsParams(p));
      }
    }
    return with_columns(head_dim, LayoutConstant<HeadLayout::kColumns>{}, p);
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

template <bool kSparse>
LaunchStatus LaunchAttention(const AttentionParams& p, const PositionSource& src, int positions,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return WithPartsKernel<kSparse>(
      p, positions, [&](const PartsKernel& k, const Plan& plan, auto head_dim) -> LaunchStatus {
        constexpr int kD = decltype(head_dim)::value;
        if (k.setup != cudaSuccess) return LaunchStatus{k.setup, nullptr};
        if (p.num_seqs == 0) return {};
        if (workspace_bytes < PartialBytes(p, plan)) {
          return LaunchStatus{cudaErrorInvalidValue, nullptr};
        }
        float* parts = static_cast<float*>(workspace);
        const AttentionParams kp = k.ParamsFor(p);
        const dim3 grid(plan.splits, plan.ctas_per_split(kp.cache.num_kv_heads), p.num_seqs);
        cudaError_t launched = LaunchDependent(k.kernel, grid, dim3(kWarps * 32), k.shared_bytes,
                                               stream, false, kp, src, plan, parts);
        if (launched != cudaSuccess || (plan.parts() == 1 && k.finishes_single_parts())) {
          // Failed, or the parts kernel wrote the outputs itself.
        } else {
          const dim3 heads(p.num_q_heads, p.num_seqs);
          const float* parts_in = parts;
          auto combine = [&](auto warps, auto batch) {
            constexpr int kCombineWarps = decltype(warps)::value;
            return LaunchDependent(
                AttentionCombineKernel<kD, kCombineWarps, decltype(batch)::value>, heads,
                dim3(kCombineWarps * 32), 0, stream, false, p, plan.parts(), parts_in);
          };
          auto with_batch = [&](auto warps) {
            switch (CombineBatch(plan.parts(), decltype(warps)::value)) {
              case 8:
                return combine(warps, IntConstant<8>{});
              case 4:
                return combine(warps, IntConstant<4>{});
              case 2:
                return combine(warps, IntConstant<2>{});
              default:
                return combine(warps, IntConstant<1>{});
            }
          };
          switch (CombineWarps(plan.parts())) {
            case 16:
              launched = with_batch(IntConstant<16>{});
              break;
            case 8:
              launched = with_batch(IntConstant<8>{});
              break;
            default:
              launched = with_batch(IntConstant<4>{});
          }
        }
        return LaunchStatus{launched, nullptr};
      });
}

template <bool kSparse>
size_t AttentionWorkspaceBytes(const AttentionParams& p, int positions) {
  size_t bytes = 0;
  WithPartsKernel<kSparse>(p, positions,
                           [&](const PartsKernel&, const Plan& plan, auto) -> LaunchStatus {
                             bytes = PartialBytes(p, plan);
                             return {};
                           });
  return bytes;
}

}  // namespace kvp::attention
