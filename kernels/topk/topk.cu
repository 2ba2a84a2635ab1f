// Top-k as a radix select over order-preserving 32-bit keys, by a cooperative grid: every row is
// cut into contiguous slices, one per CTA. Three histogram passes (11, 11 and 10 bits) find the
// k-th largest key T and how many elements equal to T to take; a last pass compacts the selected
// positions in index order (elements above T, then ties by lower position), so the output is the
// reference's exactly. Barriers between the passes are per row (rows never wait for each other, and
// few CTAs share a counter); the launch is cooperative so every CTA is resident. A CTA reads its
// slice once: thread t keeps the keys of elements [16 t, 16 t + 16) in registers for all passes.
// The workspace needs no zeroing before the launch: each row's first CTA clears the row's
// counter and histograms, and one grid-wide barrier orders that before any use.
#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/topk/topk_launch.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;
constexpr int kBins = 2048;
constexpr int kPasses = 3;
// Digit of each pass: bits [Shift, Shift + Width) of the key.
__host__ __device__ constexpr int Shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__host__ __device__ constexpr int Width(int pass) { return pass == 2 ? 10 : 11; }
constexpr int kElementsPerCta = 4096;  // enough work per CTA to amortize the barriers
constexpr int kPerThread = kElementsPerCta / kThreads;                  // keys a thread holds
constexpr int64_t kMaxRowLength = int64_t{kThreads} * kElementsPerCta;  // CTAs per row <= kThreads

// Workspace: per-row barrier counters, per-row histograms of each pass, per-CTA counts; cleared
// by the kernel itself.
struct Layout {
  int rows = 0;  // rows per launch
  int ctas_per_row = 1;
  __host__ __device__ size_t barrier_bytes() const { return (size_t(rows) * 4 + 255) / 256 * 256; }
  __host__ __device__ size_t hist_bytes() const {
    return size_t(kPasses) * rows * kBins * sizeof(uint32_t);
  }
  size_t counts_bytes() const { return size_t(rows) * ctas_per_row * 2 * sizeof(uint32_t); }
  size_t total() const { return barrier_bytes() + hist_bytes() + counts_bytes(); }
};

// NaN -> 0 (never selected); -0 -> +0; otherwise larger float, larger key (>= 1).
__device__ __forceinline__ uint32_t Key(float f) {
  if (isnan(f)) return 0u;
  uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Waits until `target` arrivals at `counter` (the CTAs of one row, phase by phase).
__device__ __forceinline__ void GridBarrier(unsigned int* counter, unsigned int target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*reinterpret_cast<volatile unsigned int*>(counter) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

// Exclusive prefix sum over the block; *total gets the sum of all.
__device__ __forceinline__ uint32_t BlockExclusiveScan(uint32_t v, uint32_t* total) {
  __shared__ uint32_t warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t n = __shfl_up_sync(0xFFFFFFFFu, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint32_t before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();
  *total = all;
  return before + inclusive - v;
}

__global__ void __launch_bounds__(kThreads)
    TopkKernel(TopkParams p, int row0, Layout layout, uint8_t* workspace) {
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t s_prefix, s_mask, s_k_rem;
  __shared__ int s_take_all;
  const int row_local = blockIdx.x / layout.ctas_per_row;
  unsigned int* barrier = reinterpret_cast<unsigned int*>(workspace) + row_local;
  uint32_t* ghist = reinterpret_cast<uint32_t*>(workspace + layout.barrier_bytes());
  uint32_t* counts =
      reinterpret_cast<uint32_t*>(workspace + layout.barrier_bytes() + layout.hist_bytes());

  const int cta = blockIdx.x % layout.ctas_per_row;
  const int row = row0 + row_local;
  const bool live_row = row_local < layout.rows && row < p.num_rows;
  const int32_t len = live_row ? p.lengths[row] : 0;
  const float* scores = p.scores + int64_t{row} * p.scores_stride;
  const int32_t per_cta = (len + layout.ctas_per_row - 1) / layout.ctas_per_row;  // <= 4096
  const int32_t begin = min(len, cta * per_cta), end = min(len, begin + per_cta);
  // This thread's elements and their keys (0 past the slice: never counted, never selected).
  const int32_t my_begin = begin + static_cast<int32_t>(threadIdx.x) * kPerThread;
  uint32_t keys[kPerThread];
  {
    float v[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) v[j] = my_begin + j < end ? scores[my_begin + j] : NAN;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) keys[j] = Key(v[j]);
  }
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_k_rem = static_cast<uint32_t>(p.k);
    s_take_all = 0;
  }
  if (cta == 0) {
    if (threadIdx.x == 0) *barrier = 0u;
    for (int pass = 0; pass < kPasses; ++pass) {
      uint32_t* h = ghist + (size_t(pass) * layout.rows + row_local) * kBins;
      for (int b = threadIdx.x; b < kBins; b += kThreads) h[b] = 0u;
    }
  }
  __threadfence();
  cooperative_groups::this_grid().sync();  // the clearing is done everywhere
  __syncthreads();

  unsigned int phase = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const uint32_t prefix = s_prefix, mask = s_mask;
    const bool active = live_row && !s_take_all;
    for (int b = threadIdx.x; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    if (active) {
      const uint32_t digit_mask = (1u << Width(pass)) - 1u;
      // Scores crowd into few bins (the first pass sees exponents), so the lanes of a warp that
      // share a bin add once, together.
      const unsigned lane = threadIdx.x % 32;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint32_t key = keys[j];
        const bool counted = key != 0u && (key & mask) == prefix;
        const uint32_t bin = counted ? (key >> Shift(pass)) & digit_mask : kBins;
        const unsigned peers = __match_any_sync(0xFFFFFFFFu, bin);
        if (counted && lane == static_cast<unsigned>(__ffs(peers) - 1))
          atomicAdd(&hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    uint32_t* row_hist = ghist + (size_t(pass) * layout.rows + row_local) * kBins;
    if (active) {
      for (int b = threadIdx.x; b < kBins; b += kThreads) {
        if (hist[b] != 0u) atomicAdd(&row_hist[b], hist[b]);
      }
    }
    GridBarrier(barrier, ++phase * layout.ctas_per_row);
    if (!active) continue;
    // Find the digit holding the k_rem-th largest remaining key.
    for (int b = threadIdx.x; b < kBins; b += kThreads) hist[b] = __ldcg(&row_hist[b]);
    __syncthreads();
    constexpr int kPer = kBins / kThreads;
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) mine += hist[threadIdx.x * kPer + j];
    // Sum of the bins above this thread's: a scan over threads in reverse order.
    uint32_t total;
    const uint32_t above_reversed = BlockExclusiveScan(mine, &total);  // bins below, in fact
    const uint32_t above = total - above_reversed - mine;
    const uint32_t k_rem = s_k_rem;
    if (total < k_rem) {
      if (threadIdx.x == 0) s_take_all = 1;  // fewer valid elements than k: take them all
    } else {
      uint32_t running = above;
      for (int j = kPer - 1; j >= 0; --j) {
        const int b = threadIdx.x * kPer + j;
        if (running < k_rem && running + hist[b] >= k_rem) {
          s_prefix = prefix | (uint32_t(b) << Shift(pass));
          s_mask = mask | (((1u << Width(pass)) - 1u) << Shift(pass));
          s_k_rem = k_rem - running;
        }
        running += hist[b];
      }
    }
    __syncthreads();
  }

  // Selection: key > T, plus the first `need` keys equal to T in index order.
  const uint32_t threshold = s_take_all ? 0u : s_prefix;
  const uint32_t need = s_take_all ? 0u : s_k_rem;
  uint32_t gt = 0, eq = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    gt += keys[j] > threshold;
    eq += keys[j] == threshold && keys[j] != 0u;
  }
  uint32_t cta_gt, cta_eq;
  const uint32_t eq_before_me = BlockExclusiveScan(eq, &cta_eq);
  BlockExclusiveScan(gt, &cta_gt);
  uint32_t* row_counts = counts + size_t(row_local) * layout.ctas_per_row * 2;
  if (live_row && threadIdx.x == 0) {
    row_counts[2 * cta] = cta_gt;
    row_counts[2 * cta + 1] = cta_eq;
  }
  GridBarrier(barrier, ++phase * layout.ctas_per_row);
  if (!live_row) return;
  // The row's CTAs' counts, one per thread (ctas_per_row <= kThreads), scanned in one pass rather
  // than read one after another by every thread.
  __shared__ uint32_t s_gt_before, s_eq_before;
  const bool holds = static_cast<int>(threadIdx.x) < layout.ctas_per_row;
  const uint32_t g_i = holds ? __ldcg(&row_counts[2 * threadIdx.x]) : 0u;
  const uint32_t e_i = holds ? __ldcg(&row_counts[2 * threadIdx.x + 1]) : 0u;
  uint32_t gt_total, eq_total;
  const uint32_t g_prefix = BlockExclusiveScan(g_i, &gt_total);
  const uint32_t e_prefix = BlockExclusiveScan(e_i, &eq_total);
  if (static_cast<int>(threadIdx.x) == cta) {
    s_gt_before = g_prefix;
    s_eq_before = e_prefix;
  }
  __syncthreads();
  const uint32_t gt_before = s_gt_before, eq_before = s_eq_before;
  const uint32_t tie_rank0 = eq_before + eq_before_me;
  const uint32_t ties_taken = tie_rank0 >= need ? 0u : min(eq, need - tie_rank0);
  uint32_t unused;
  const uint32_t out_before_me = BlockExclusiveScan(gt + ties_taken, &unused);
  int32_t* out = p.indices + int64_t{row} * p.k;
  uint32_t pos = gt_before + min(eq_before, need) + out_before_me;
  uint32_t rank = tie_rank0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t key = keys[j];
    if (key > threshold) {
      out[pos++] = my_begin + j;
    } else if (key == threshold && key != 0u) {
      if (rank < need) out[pos++] = my_begin + j;
      ++rank;
    }
  }
  if (cta == layout.ctas_per_row - 1) {
    const uint32_t selected = gt_total + min(eq_total, need);
    for (uint32_t i = selected + threadIdx.x; i < static_cast<uint32_t>(p.k); i += kThreads)
      out[i] = -1;
  }
}

Layout MakeLayout(const TopkParams& p) {
  static int capacity = [] {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, TopkKernel, kThreads, 0);
    return sms * (per_sm > 0 ? per_sm : 1);
  }();
  // Every CTA's slice must fit its threads' registers (kElementsPerCta), so rows that do not fit
  // the GPU at once go in several launches rather than in longer slices.
  Layout layout;
  const int by_length = (p.scores_stride + kElementsPerCta - 1) / kElementsPerCta;
  layout.ctas_per_row = max(1, by_length);
  layout.rows = max(1, min(p.num_rows, capacity / layout.ctas_per_row));
  return layout;
}

}  // namespace

size_t TopkWorkspaceBytes(const TopkParams& p) { return MakeLayout(p).total(); }

LaunchStatus TopkLaunch(const TopkParams& p, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  if (p.k < 1 || p.k > kMaxTopk) return Unsupported("k outside [1, 2048]");
  if (p.scores_stride > kMaxRowLength) return Unsupported("top-k rows over 1,048,576 scores");
  if (p.num_rows == 0) return {};
  Layout layout = MakeLayout(p);
  if (workspace_bytes < layout.total()) return LaunchStatus{cudaErrorInvalidValue, nullptr};
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  for (int row0 = 0; row0 < p.num_rows; row0 += layout.rows) {
    TopkParams params = p;
    int first = row0;
    void* args[] = {&params, &first, &layout, &ws};
    const cudaError_t launch = cudaLaunchCooperativeKernel(
        reinterpret_cast<const void*>(TopkKernel), dim3(layout.rows * layout.ctas_per_row),
        dim3(kThreads), args, 0, stream);
    if (launch != cudaSuccess) return LaunchStatus{launch, nullptr};
  }
  return LastLaunchError();
}

}  // namespace kvp
