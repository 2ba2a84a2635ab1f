// Top-k as a radix select over order-preserving 32-bit keys, by a cooperative grid: every row is
// cut into contiguous slices, one per CTA. Up to three histogram passes (digits of 11, 11 and 10
// bits, or 12, 12 and 8) find the k-th largest key T and how many elements equal to T to take; a
// last pass compacts the selected positions in index order (elements above T, then ties by lower
// position), so the output is the reference's exactly. Barriers between the passes are per row
// (rows never wait for each other, and few CTAs share a counter); the launch is cooperative so
// every CTA is resident. A CTA reads its slice once: each thread keeps the keys of 8 (or 16)
// consecutive elements in registers for all passes. A pass stops the search early when the bin it
// chose holds exactly the keys still needed (often after two passes when scores are distinct): that
// bin is taken whole.
//
// The third pass, with its barrier, is seldom needed. The second pass writes each CTA's candidates
// (its keys that share the k-th largest key's first digit) to global memory sorted by their second
// digit, where its suffix counts say each digit's keys start. So when the second digit leaves more
// than one key in the k-th's bin (a smaller key shares the k-th's top 24 bits, or ties it), every
// CTA reads just that bin's few keys from each CTA's list and finds the k-th among them on its own,
// without a third histogram and barrier. The third pass is left to rows whose k-th's 24-bit bin
// holds more keys than a CTA reads at once, or whose 12-bit bin more than an eighth of the row
// (thousands of ties; see MaxListCandidates).
//
// At most three barriers a row, one per pass, and nothing else to wait for:
//   - the compaction needs, for each CTA, how many elements of the CTAs before it are selected.
//     Each pass publishes the CTA's suffix counts (how many of its candidates have a digit >= b,
//     for every b), so once the last pass has chosen its digit every count is there to read;
//   - the row's counters and histograms must be zero when the kernel starts. They live in a buffer
//     that is zeroed once when allocated, and the last CTA of a row to finish zeroes them again.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/work_split.h"
#include "kernels/topk/topk_launch.h"

namespace kvp {
namespace {

constexpr int kPasses = 3;
// Histograms of kBinsPerThread bins per thread: 2048 for 256 threads (digits of 11, 11 and 10
// bits), 4096 for 512 (12, 12 and 8 bits: after 24 bits the bin of the k-th key seldom holds
// more keys than are needed, so a batch of one row often stops there; see the early stop).
constexpr int kBinsPerThread = 8;
__host__ __device__ constexpr int Log2(int n) { return n <= 1 ? 0 : 1 + Log2(n / 2); }
// Digit of each pass: bits [Shift, Shift + Width) of the key.
template <int kBins>
__host__ __device__ constexpr int Width(int pass) {
  return pass == 2 ? 32 - 2 * Log2(kBins) : Log2(kBins);
}
template <int kBins>
__host__ __device__ constexpr int Shift(int pass) {
  return pass == 0 ? 32 - Log2(kBins) : pass == 1 ? 32 - 2 * Log2(kBins) : 0;
}
constexpr int kElementsPerCta = 4096;  // enough work per CTA to amortize the barriers
// The pass that writes its candidates sorted by digit, and how many keys of the k-th's bin each
// thread reads when that bin is resolved from them (more take the third pass).
constexpr int kListPass = 1;
constexpr int kListKeysPerThread = 4;
// The list pass ranks each candidate by its own shared-memory atomic, which lanes of a warp that
// share a bin would serialize on: so it is taken only when the candidates are at most an eighth of
// the row's keys (spread over 4,096 bins, they seldom meet). Rows of more (mostly ties, whose
// k-th's bin is then too full for the list anyway) count as the other passes do, without ranks
// (and a warp whose keys share one bin adds them at once).
__host__ __device__ constexpr uint32_t MaxListCandidates(int ctas_per_row) {
  return uint32_t(ctas_per_row) * (kElementsPerCta / 8);
}
// Whether the list pass, counting `candidates` of the row's keys, writes them to the lists.
__host__ __device__ constexpr bool ListsCandidates(uint32_t candidates, int ctas_per_row) {
  return candidates <= MaxListCandidates(ctas_per_row);
}
// Whether the k-th's bin after the list pass, of `bin_keys` keys, is resolved from the lists by
// CTAs of `threads` threads (else the third pass takes it).
__host__ __device__ constexpr bool ResolvesFromList(uint32_t bin_keys, int threads) {
  return bin_keys <= uint32_t(kListKeysPerThread) * threads;
}
// CTAs of 512 threads (8 keys each, two CTAs an SM) when a launch's CTAs fit the GPU that way:
// twice the warps of a 256-thread CTA to hide each warp's latency, which is what a batch of one
// row waits on. Batches that need more CTAs than that take 256 threads (16 keys each, four an SM),
// so they still go in one launch.
constexpr int kWideThreads = 512, kNarrowThreads = 256;
// A row's CTAs must all be resident: 256 of them fit an H100/H200.
constexpr int64_t kMaxRowLength = int64_t{1} << 20;
static_assert(kMaxRowLength / kElementsPerCta <= kNarrowThreads, "one thread per CTA of a row");
static_assert(kElementsPerCta < 65536, "suffix counts are 16-bit");

// Counters (zero between launches): per row an arrival and a departure count, then the row's
// histogram of each pass. Scratch (rewritten by every launch): per CTA and pass, its suffix counts;
// then per CTA its candidate list (its second pass's candidates sorted by digit, kElementsPerCta
// keys at most).
struct Layout {
  int threads = kWideThreads;  // per CTA
  int rows = 0;                // rows per launch
  int ctas_per_row = 1;
  bool fits = true;  // a row's CTAs are resident at once on this GPU
  size_t bins() const { return size_t(threads) * kBinsPerThread; }
  __host__ __device__ size_t control_words() const { return (size_t(rows) * 2 + 63) / 64 * 64; }
  size_t counter_bytes() const {
    return (control_words() + size_t(rows) * kPasses * bins()) * sizeof(uint32_t);
  }
  size_t suffix_bytes() const {
    return size_t(rows) * ctas_per_row * kPasses * bins() * sizeof(uint16_t);
  }
  size_t scratch_bytes() const {
    return suffix_bytes() + size_t(rows) * ctas_per_row * kElementsPerCta * sizeof(uint32_t);
  }
};

// NaN -> 0 (never selected); -0 -> +0; otherwise larger float, larger key (>= 1).
__host__ __device__ __forceinline__ uint32_t Key(float f) {
  if (f != f) return 0u;
  uint32_t u = 0u;
  if (f != 0.0f) memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Waits until `target` arrivals at `counter` (the CTAs of one row, pass by pass). The arrival is a
// release at GPU scope (the CTA's histogram and suffix counts, ordered before it by the CTA
// barrier, are visible to whoever sees it) and the wait an acquire, instead of sequentially
// consistent fences on either side.
__device__ __forceinline__ void RowBarrier(unsigned int* counter, unsigned int target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    unsigned int arrived;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(arrived) : "l"(counter) : "memory");
    } while (arrived < target);
  }
  __syncthreads();
}

// Exclusive prefix sum over the block; *total gets the sum of all.
template <int kThreads>
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

// This thread's kPerThread keys, elements [first, first + kPerThread) of the slice that ends at
// `end` (keys past it are 0: never counted, never selected). `vector_loads`: the row is 16-byte
// aligned and its stride a multiple of 4, so a float4 that starts before `end` stays inside it.
template <int kPerThread>
__device__ __forceinline__ void LoadKeys(const float* scores, int32_t first, int32_t end,
                                         bool vector_loads, uint32_t* keys) {
  float v[kPerThread];
  if (vector_loads) {
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) {
      const float4 f = first + 4 * q < end
                           ? *reinterpret_cast<const float4*>(scores + first + 4 * q)
                           : make_float4(NAN, NAN, NAN, NAN);
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) v[j] = first + j < end ? scores[first + j] : NAN;
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) keys[j] = first + j < end ? Key(v[j]) : 0u;
}

// 16-bit suffix counts of this thread's kBinsPerThread bins, given how many of the CTA's
// candidates have a digit >= its first bin; into shared memory too when `shared_copy` is not null.
template <int kBinsPerThread>
__device__ __forceinline__ void StoreSuffixCounts(const uint32_t* bins, uint32_t at_or_above,
                                                  uint16_t* dst, uint16_t* shared_copy) {
  uint32_t packed[kBinsPerThread / 2];
#pragma unroll
  for (int j = 0; j < kBinsPerThread; j += 2) {
    const uint32_t lo = at_or_above;
    const uint32_t hi = at_or_above - bins[j];
    at_or_above = hi - bins[j + 1];
    packed[j / 2] = lo | (hi << 16);
  }
  static_assert(kBinsPerThread % 4 == 0, "8-byte stores");
#pragma unroll
  for (int j = 0; j < kBinsPerThread / 4; ++j) {
    reinterpret_cast<uint2*>(dst)[j] = make_uint2(packed[2 * j], packed[2 * j + 1]);
    if (shared_copy != nullptr)
      reinterpret_cast<uint2*>(shared_copy)[j] = make_uint2(packed[2 * j], packed[2 * j + 1]);
  }
}

// The search's state, shared by a CTA's threads. Keys whose masked bits equal `prefix` are still
// candidates; k_rem of them are to be taken.
struct SearchState {
  uint32_t prefix, mask, k_rem;
  uint32_t digit[kPasses];  // the bin each pass chose
  uint32_t candidates;      // how many of the row's keys the next pass counts
  // Resolved from the lists: keys of the CTAs before this one above the k-th, and equal to it.
  uint32_t list_gt_before, list_eq_before;
  int take_all;  // fewer valid keys than k: take them all
  int done;      // the last bin chosen holds exactly the keys still needed: take it whole
  int passes;    // histogram passes taken
  int last;      // this CTA is the row's last to finish
};

// Cuts the search short after the second pass: finds the k-th largest key among the keys of the
// bin the second pass chose (s.candidates of them, at most kListKeysPerThread a thread), which
// every CTA of the row wrote to its list sorted by digit (`row_list`), so no third histogram and
// no third barrier. Leaves in `s` the full key as the prefix (mask all ones), how many keys equal
// to it to take, and how many keys above and equal to it the CTAs before `cta` hold in that bin.
template <int kThreads, int kBins>
__device__ __forceinline__ void ResolveFromList(const uint32_t* row_list,
                                                const uint16_t* row_suffix, int ctas_per_row,
                                                int cta, SearchState& s) {
  constexpr int kLastBins = 1 << Width<kBins>(kPasses - 1);  // the digit not searched yet
  constexpr int kLastPerThread = (kLastBins + kThreads - 1) / kThreads;
  __shared__ uint32_t part_begin[kNarrowThreads], part_first[kNarrowThreads];
  __shared__ uint32_t last_hist[kLastBins];
  const uint32_t prefix = s.prefix, k_rem = s.k_rem, bin_keys = s.candidates;
  const uint32_t digit = s.digit[kListPass];
  // CTA i's keys of the bin are [first, end) of its list: its suffix counts of the digits above
  // the chosen one, and of the chosen one and above. Where they go in the bin's keys: a scan.
  uint32_t first = 0, count = 0;
  if (static_cast<int>(threadIdx.x) < ctas_per_row) {
    const uint16_t* at_or_above =
        row_suffix + size_t(threadIdx.x) * kPasses * kBins + size_t(kListPass) * kBins;
    first = digit + 1 < kBins ? __ldcg(at_or_above + digit + 1) : 0u;
    count = __ldcg(at_or_above + digit) - first;
  }
  uint32_t unused;
  const uint32_t begin = BlockExclusiveScan<kThreads>(count, &unused);
  if (static_cast<int>(threadIdx.x) < ctas_per_row) {
    part_begin[threadIdx.x] = begin;
    part_first[threadIdx.x] = first;
  }
  for (int b = threadIdx.x; b < kLastBins; b += kThreads) last_hist[b] = 0;
  __syncthreads();
  // Key v of the bin: in the last CTA whose part begins at or before v. All loads first, then a
  // histogram of the last digit (the high half counts the keys of the CTAs before this one).
  uint32_t keys[kListKeysPerThread];
  int parts[kListKeysPerThread];
#pragma unroll
  for (int m = 0; m < kListKeysPerThread; ++m) {
    const uint32_t v = threadIdx.x + m * kThreads;
    parts[m] = 0;
    keys[m] = 0;
    if (v < bin_keys) {
      int lo = 0, hi = ctas_per_row - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (part_begin[mid] <= v)
          lo = mid;
        else
          hi = mid - 1;
      }
      parts[m] = lo;
      keys[m] =
          __ldcg(row_list + size_t(lo) * kElementsPerCta + part_first[lo] + v - part_begin[lo]);
    }
  }
#pragma unroll
  for (int m = 0; m < kListKeysPerThread; ++m) {
    if (threadIdx.x + m * kThreads < bin_keys)
      atomicAdd(&last_hist[keys[m] & (kLastBins - 1)], parts[m] < cta ? 0x10001u : 1u);
  }
  __syncthreads();
  // Thread t holds bins kLastBins - 1 - t * kLastPerThread and down, so an exclusive scan counts
  // the keys above them. Both halves stay under 2^16: at most kListKeysPerThread * kThreads keys.
  uint32_t counts[kLastPerThread], mine = 0;
#pragma unroll
  for (int j = 0; j < kLastPerThread; ++j) {
    const int b = kLastBins - 1 - static_cast<int>(threadIdx.x) * kLastPerThread - j;
    mine += counts[j] = b >= 0 ? last_hist[b] : 0u;
  }
  uint32_t above = BlockExclusiveScan<kThreads>(mine, &unused);
#pragma unroll
  for (int j = 0; j < kLastPerThread; ++j) {
    const int b = kLastBins - 1 - static_cast<int>(threadIdx.x) * kLastPerThread - j;
    const uint32_t all_above = above & 0xFFFFu, all_here = counts[j] & 0xFFFFu;
    if (b >= 0 && all_above < k_rem && all_above + all_here >= k_rem) {
      s.prefix = prefix | static_cast<uint32_t>(b);
      s.mask = ~0u;
      s.k_rem = k_rem - all_above;
      s.list_gt_before = above >> 16;
      s.list_eq_before = counts[j] >> 16;
    }
    above += counts[j];
  }
  __syncthreads();
}

// 64 registers a thread in both shapes: 1024 threads an SM.
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    TopkKernel(TopkParams p, int row0, Layout layout, bool vector_loads, uint32_t* counters,
               uint16_t* suffix_counts, uint32_t* lists) {
  constexpr int kPerThread = kElementsPerCta / kThreads;  // keys a thread holds
  constexpr int kBins = kThreads * kBinsPerThread;
  __shared__ uint32_t hist[kBins];
  // The list pass's suffix counts: where the keys of each digit start in the CTA's list.
  __shared__ __align__(8) uint16_t list_at_or_above[kBins + 4];
  __shared__ SearchState s;
  const int row_local = blockIdx.x / layout.ctas_per_row;
  const int cta = blockIdx.x % layout.ctas_per_row;
  const int row = row0 + row_local;
  LetDependentsLaunch();
  WaitForPredecessor();  // the scores, and the indices the kernel before may still read
  // Rows past the batch are whole rows of CTAs: none of them touches the counters.
  if (row_local >= layout.rows || row >= p.num_rows) return;
  unsigned int* arrivals = counters + 2 * row_local;
  unsigned int* departures = arrivals + 1;
  uint32_t* row_hist = counters + layout.control_words() + size_t(row_local) * kPasses * kBins;
  uint16_t* cta_suffix = suffix_counts + size_t(blockIdx.x) * kPasses * kBins;
  const uint16_t* row_suffix =
      suffix_counts + size_t(row_local) * layout.ctas_per_row * kPasses * kBins;
  uint32_t* row_list = lists + size_t(row_local) * layout.ctas_per_row * kElementsPerCta;
  const int first_bin = threadIdx.x * kBinsPerThread;  // this thread's bins in scans

  const int32_t len = p.lengths[row];
  const float* scores = p.scores + int64_t{row} * p.scores_stride;
  // Slices start at multiples of kPerThread elements, so a thread's keys are aligned float4s.
  const int32_t per_cta = ((len + layout.ctas_per_row - 1) / layout.ctas_per_row + kPerThread - 1) /
                          kPerThread * kPerThread;  // <= kElementsPerCta
  const int32_t begin = min(len, cta * per_cta), end = min(len, begin + per_cta);
  const int32_t my_begin = begin + static_cast<int32_t>(threadIdx.x) * kPerThread;
  uint32_t keys[kPerThread];
  LoadKeys<kPerThread>(scores, my_begin, end, vector_loads, keys);
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.mask = 0;
    s.k_rem = static_cast<uint32_t>(p.k);
    s.candidates = 0;
    s.list_gt_before = 0;
    s.list_eq_before = 0;
    s.take_all = 0;
    s.done = 0;
    s.passes = 0;
  }
  __syncthreads();

  bool from_list = false;
  for (int pass = 0; pass < kPasses; ++pass) {
    const uint32_t prefix = s.prefix, mask = s.mask;
    const bool list_pass = pass == kListPass && ListsCandidates(s.candidates, layout.ctas_per_row);
    for (int b = threadIdx.x; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t digit_mask = (1u << Width<kBins>(pass)) - 1u;
    // The list pass: each candidate's rank among the CTA's candidates of its digit, two 16-bit
    // ranks a register.
    uint32_t ranks[(kPerThread + 1) / 2] = {};
    if (list_pass) {
      // Few candidates, their digits spread out: each adds its own and gets its rank.
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint32_t key = keys[j];
        if (key != 0u && (key & mask) == prefix) {
          const uint32_t rank = atomicAdd(&hist[(key >> Shift<kBins>(pass)) & digit_mask], 1u);
          ranks[j / 2] |= rank << (16 * (j % 2));
        }
      }
    } else {
      // Every key adds its own. Scores crowd into few bins (the first pass sees exponents), but
      // shared-memory atomics that meet in a bin cost less than grouping the lanes that share one
      // (__match_any_sync took 3.8 us of a 14 us row of 163,840, these 0.6). Only a warp whose
      // keys all share one bin (ties, a row of -inf) adds once, so its lanes never queue on it.
      const unsigned lane = threadIdx.x % 32;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint32_t key = keys[j];
        const bool counted = key != 0u && (key & mask) == prefix;
        const uint32_t bin = counted ? (key >> Shift<kBins>(pass)) & digit_mask : kBins;
        const uint32_t first = __shfl_sync(0xFFFFFFFFu, bin, 0);
        if (__all_sync(0xFFFFFFFFu, bin == first)) {
          if (lane == 0 && first != kBins) atomicAdd(&hist[first], 32u);
        } else if (counted) {
          atomicAdd(&hist[bin], 1u);
        }
      }
    }
    __syncthreads();
    // Publish: the CTA's counts into the row's histogram, and its suffix counts.
    uint32_t* pass_hist = row_hist + size_t(pass) * kBins;
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      if (hist[b] != 0u) atomicAdd(&pass_hist[b], hist[b]);
    }
    {
      uint32_t bins[kBinsPerThread], sum = 0;
#pragma unroll
      for (int j = 0; j < kBinsPerThread; ++j) sum += bins[j] = hist[first_bin + j];
      uint32_t cta_total;
      const uint32_t below = BlockExclusiveScan<kThreads>(sum, &cta_total);
      StoreSuffixCounts<kBinsPerThread>(bins, cta_total - below,
                                        cta_suffix + size_t(pass) * kBins + first_bin,
                                        list_pass ? list_at_or_above + first_bin : nullptr);
    }
    if (list_pass) {
      // The candidates into the CTA's list, sorted by digit: the keys of digit d start after those
      // of the digits above it.
      if (threadIdx.x == 0) list_at_or_above[kBins] = 0;
      __syncthreads();
      uint32_t* list = row_list + size_t(cta) * kElementsPerCta;
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const uint32_t key = keys[j];
        if (key != 0u && (key & mask) == prefix) {
          const uint32_t bin = (key >> Shift<kBins>(pass)) & digit_mask;
          list[list_at_or_above[bin + 1] + ((ranks[j / 2] >> (16 * (j % 2))) & 0xFFFFu)] = key;
        }
      }
    }
    RowBarrier(arrivals, (pass + 1) * layout.ctas_per_row);

    // Find the digit holding the k_rem-th largest remaining key: this thread's bins of the row's
    // histogram, and how many keys lie in the bins above them (a scan over threads, reversed).
    uint32_t bins[kBinsPerThread];
#pragma unroll
    for (int j = 0; j < kBinsPerThread; j += 4) {
      const uint4 four = __ldcg(reinterpret_cast<const uint4*>(pass_hist + first_bin + j));
      bins[j] = four.x;
      bins[j + 1] = four.y;
      bins[j + 2] = four.z;
      bins[j + 3] = four.w;
    }
    uint32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) mine += bins[j];
    uint32_t total;
    const uint32_t below = BlockExclusiveScan<kThreads>(mine, &total);
    const uint32_t above = total - below - mine;
    const uint32_t k_rem = s.k_rem;
    __syncthreads();  // every thread has read the state before one of them changes it
    if (total < k_rem) {
      if (threadIdx.x == 0) s.take_all = 1;
    } else {
      uint32_t running = above;
#pragma unroll
      for (int j = kBinsPerThread - 1; j >= 0; --j) {
        if (running < k_rem && running + bins[j] >= k_rem) {
          s.prefix = prefix | (uint32_t(first_bin + j) << Shift<kBins>(pass));
          s.mask = mask | (digit_mask << Shift<kBins>(pass));
          s.k_rem = k_rem - running;
          s.digit[pass] = first_bin + j;
          s.candidates = bins[j];
          if (bins[j] == k_rem - running) s.done = 1;
        }
        running += bins[j];
      }
    }
    if (threadIdx.x == 0) s.passes = pass + 1;
    __syncthreads();
    if (s.take_all || s.done) break;  // the same for every CTA of the row: all leave together
    if (list_pass && ResolvesFromList(s.candidates, kThreads)) {
      ResolveFromList<kThreads, kBins>(row_list, row_suffix, layout.ctas_per_row, cta, s);
      from_list = true;
      break;
    }
  }

  // Selection: keys whose masked bits exceed the prefix, then the first `need` keys equal to it
  // in index order (all of them when the last bin was taken whole, or take_all).
  const bool take_all = s.take_all;
  const int passes = s.passes;
  const uint32_t mask = take_all ? 0u : s.mask;
  const uint32_t threshold = take_all ? 0u : s.prefix;
  const uint32_t need = take_all || s.done ? UINT32_MAX : s.k_rem;
  uint32_t gt = 0, eq = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t masked = keys[j] & mask;
    gt += masked > threshold;
    eq += masked == threshold && keys[j] != 0u;
  }
  uint32_t cta_eq;
  const uint32_t eq_before_me = BlockExclusiveScan<kThreads>(eq, &cta_eq);
  // Thread i reads CTA i's counts from its suffix counts: keys whose digit exceeded the chosen
  // one in the pass that parted them from the prefix, and (last pass) those equal to it. After the
  // list, the keys of the k-th's bin that the CTAs before this one hold are counted already.
  __shared__ uint32_t s_gt_before, s_eq_before;
  uint32_t g_i = 0, e_i = 0;
  if (static_cast<int>(threadIdx.x) < layout.ctas_per_row) {
    const uint16_t* c = row_suffix + size_t(threadIdx.x) * kPasses * kBins;
    auto at_or_above = [&](int pass, uint32_t b) -> uint32_t {
      return b < kBins ? __ldcg(c + size_t(pass) * kBins + b) : 0u;
    };
    if (take_all) {
      e_i = at_or_above(0, 0);  // every valid key
    } else {
      // All of the CTA's counts asked for at once (one wait on L2, not one a pass).
      uint32_t above[kPasses];
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass)
        above[pass] = pass < passes ? at_or_above(pass, s.digit[pass] + 1) : 0u;
      const uint32_t at_last = from_list ? 0u : at_or_above(passes - 1, s.digit[passes - 1]);
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) g_i += above[pass];
      uint32_t above_last = above[0];  // above[passes - 1], without indexing registers
#pragma unroll
      for (int pass = 1; pass < kPasses; ++pass)
        above_last = pass < passes ? above[pass] : above_last;
      e_i = from_list ? 0u : at_last - above_last;
    }
  }
  uint32_t gt_total, eq_total;
  const uint32_t g_prefix = BlockExclusiveScan<kThreads>(g_i, &gt_total);
  const uint32_t e_prefix = BlockExclusiveScan<kThreads>(e_i, &eq_total);
  if (static_cast<int>(threadIdx.x) == cta) {
    s_gt_before = g_prefix + s.list_gt_before;
    s_eq_before = e_prefix + s.list_eq_before;
  }
  __syncthreads();
  const uint32_t gt_before = s_gt_before, eq_before = s_eq_before;
  const uint32_t tie_rank0 = eq_before + eq_before_me;
  const uint32_t ties_taken = tie_rank0 >= need ? 0u : min(eq, need - tie_rank0);
  uint32_t unused;
  const uint32_t out_before_me = BlockExclusiveScan<kThreads>(gt + ties_taken, &unused);
  int32_t* out = p.indices + int64_t{row} * p.k;
  uint32_t pos = gt_before + min(eq_before, need) + out_before_me;
  uint32_t rank = tie_rank0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t masked = keys[j] & mask;
    if (masked > threshold) {
      out[pos++] = my_begin + j;
    } else if (masked == threshold && keys[j] != 0u) {
      if (rank < need) out[pos++] = my_begin + j;
      ++rank;
    }
  }
  // Unless there were fewer valid keys than k, the search found the k-th: k are selected.
  if (cta == layout.ctas_per_row - 1 && take_all) {
    for (uint32_t i = eq_total + threadIdx.x; i < static_cast<uint32_t>(p.k); i += kThreads)
      out[i] = -1;
  }

  // The last CTA of the row to get here (every other one is past its barriers and reads) leaves
  // the row's counters zero for the next launch.
  __syncthreads();
  if (threadIdx.x == 0) s.last = atomicAdd(departures, 1u) == unsigned(layout.ctas_per_row) - 1u;
  __syncthreads();
  if (s.last) {
    if (threadIdx.x == 0) {
      *arrivals = 0u;
      *departures = 0u;
    }
    uint4* h = reinterpret_cast<uint4*>(row_hist);
    for (int i = threadIdx.x; i < passes * kBins / 4; i += kThreads) h[i] = make_uint4(0, 0, 0, 0);
  }
}

// CTAs of the kThreads-thread kernel resident on the whole GPU at once.
template <int kThreads>
int Capacity() {
  static const int capacity =
      ResidentCtas(reinterpret_cast<const void*>(TopkKernel<kThreads>), kThreads, 0);
  return capacity;
}

Layout MakeLayout(const TopkParams& p) {
  // Every CTA's slice must fit its threads' registers (kElementsPerCta), so rows that do not fit
  // the GPU at once go in several launches rather than in longer slices.
  Layout layout;
  const int by_length = (p.scores_stride + kElementsPerCta - 1) / kElementsPerCta;
  layout.ctas_per_row = max(1, by_length);
  const bool wide = int64_t{p.num_rows} * layout.ctas_per_row <= Capacity<kWideThreads>();
  layout.threads = wide ? kWideThreads : kNarrowThreads;
  const int capacity = wide ? Capacity<kWideThreads>() : Capacity<kNarrowThreads>();
  layout.rows = max(1, min(p.num_rows, capacity / layout.ctas_per_row));
  layout.fits = layout.ctas_per_row <= capacity;
  return layout;
}

// The kernel's search for one row, on the host: the passes it takes (the same histograms, the same
// choice of bin, the same early stop and the same use of the candidate list).
template <int kBins>
TopkSearch Search(const float* scores, int32_t len, uint32_t k, int threads, int ctas_per_row) {
  std::vector<uint32_t> keys(len);
  for (int32_t i = 0; i < len; ++i) keys[i] = Key(scores[i]);
  uint32_t prefix = 0, mask = 0, k_rem = k;
  std::vector<uint32_t> hist(kBins);
  for (int pass = 0; pass < kPasses; ++pass) {
    std::fill(hist.begin(), hist.end(), 0u);
    const uint32_t digit_mask = (1u << Width<kBins>(pass)) - 1u;
    uint32_t total = 0;
    for (uint32_t key : keys) {
      if (key != 0u && (key & mask) == prefix) {
        ++hist[(key >> Shift<kBins>(pass)) & digit_mask];
        ++total;
      }
    }
    if (total < k_rem) return {pass + 1, false};  // take them all
    uint32_t running = 0;
    int b = kBins - 1;
    while (running + hist[b] < k_rem) running += hist[b--];
    if (hist[b] == k_rem - running) return {pass + 1, false};  // the bin taken whole
    if (pass == kListPass && ListsCandidates(total, ctas_per_row) &&
        ResolvesFromList(hist[b], threads))
      return {pass + 1, true};
    prefix |= uint32_t(b) << Shift<kBins>(pass);
    mask |= digit_mask << Shift<kBins>(pass);
    k_rem -= running;
  }
  return {kPasses, false};
}

}  // namespace

TopkSearch TopkSearchOf(const TopkParams& host, int row) {
  const Layout layout = MakeLayout(host);
  const float* scores = host.scores + int64_t{row} * host.scores_stride;
  const int32_t len = host.lengths[row];
  const uint32_t k = static_cast<uint32_t>(host.k);
  return layout.threads == kWideThreads ? Search<kWideThreads * kBinsPerThread>(
                                              scores, len, k, kWideThreads, layout.ctas_per_row)
                                        : Search<kNarrowThreads * kBinsPerThread>(
                                              scores, len, k, kNarrowThreads, layout.ctas_per_row);
}

TopkWorkspaceSizes TopkWorkspaceBytes(const TopkParams& p) {
  const Layout layout = MakeLayout(p);
  return {layout.scratch_bytes(), layout.counter_bytes()};
}

LaunchStatus TopkLaunch(const TopkParams& p, const TopkWorkspace& ws, cudaStream_t stream) {
  if (p.k < 1 || p.k > kMaxTopk) return Unsupported("k outside [1, 2048]");
  if (p.scores_stride > kMaxRowLength) return Unsupported("top-k rows over 1,048,576 scores");
  if (p.num_rows == 0) return {};
  Layout layout = MakeLayout(p);
  if (!layout.fits) return Unsupported("top-k rows longer than this GPU holds at once");
  if (ws.scratch_bytes < layout.scratch_bytes() || ws.counter_bytes < layout.counter_bytes()) {
    return LaunchStatus{cudaErrorInvalidValue, nullptr};
  }
  bool vector_loads = reinterpret_cast<uintptr_t>(p.scores) % 16 == 0 && p.scores_stride % 4 == 0;
  uint32_t* counters = static_cast<uint32_t*>(ws.counters);
  uint16_t* suffix_counts = static_cast<uint16_t*>(ws.scratch);
  uint32_t* lists = reinterpret_cast<uint32_t*>(static_cast<char*>(ws.scratch) +
                                                layout.suffix_bytes());  // 16-byte aligned
  for (int row0 = 0; row0 < p.num_rows; row0 += layout.rows) {
    const cudaError_t launch = LaunchDependent(
        layout.threads == kWideThreads ? TopkKernel<kWideThreads> : TopkKernel<kNarrowThreads>,
        dim3(layout.rows * layout.ctas_per_row), dim3(layout.threads), 0, stream, true, p, row0,
        layout, vector_loads, counters, suffix_counts, lists);
    if (launch != cudaSuccess) return LaunchStatus{launch, nullptr};
  }
  return {};
}

}  // namespace kvp
