// Dot products for the CPU references: double accumulation in four independent partial sums, so
// the loop runs at throughput rather than at the latency of one add chain. (The references are
// the yardstick of the GPU kernels and the host backend's kernels; the split changes results only
// in the last bits of a double.)
#pragma once

namespace kvp {

inline double DotF64(const float* a, const float* b, int n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double{a[i]} * b[i];
    s1 += double{a[i + 1]} * b[i + 1];
    s2 += double{a[i + 2]} * b[i + 2];
    s3 += double{a[i + 3]} * b[i + 3];
  }
  for (; i < n; ++i) s0 += double{a[i]} * b[i];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace kvp
