// How the kernels that stream a sequence's positions in chunks cut the work into CTAs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvp {

inline int SmCount() {
  static int sms = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 132;
  }();
  return sms;
}

// CTAs of `kernel` (with `threads` threads and `shared_bytes` of dynamic shared memory) that fit
// on the whole GPU at once; at least 1.
inline int ResidentCtas(const void* kernel, int threads, int shared_bytes) {
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes);
  return (per_sm > 0 ? per_sm : 1) * SmCount();
}

// Picks how many CTAs share each of `base_ctas` streams of `chunks` chunks so that the CTAs fill
// the GPU's `resident_slots` in whole waves: the time is about waves × (chunks per split + a fixed
// cost per CTA), and a last wave that is mostly empty costs as much as a full one.
inline int ChooseSplits(int base_ctas, int chunks, int resident_slots) {
  if (base_ctas <= 0 || chunks <= 1) return 1;
  constexpr int kCtaCostInChunks = 2;  // pipeline fill, loading the queries, writing results
  const int max_splits = chunks < 4 * resident_slots ? chunks : 4 * resident_slots;
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= max_splits; ++s) {
    const int64_t ctas = int64_t{s} * base_ctas;
    const int64_t waves = (ctas + resident_slots - 1) / resident_slots;
    const int64_t cost = waves * ((chunks + s - 1) / s + kCtaCostInChunks);
    if (cost < best_cost) {
      best_cost = cost;
      best = s;
    }
    if (ctas >= 4 * int64_t{resident_slots}) break;
  }
  return best;
}

}  // namespace kvp
