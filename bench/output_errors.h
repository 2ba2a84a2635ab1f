// How far attention outputs are from a reference, head by head (the accuracy benchmarks): the
// relative L2 error over all outputs, its 99th percentile over heads and the worst cosine.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

namespace kvp::bench {

class OutputErrors {
 public:
  // One head's output `got` against its reference `want` (the same length).
  void Add(std::span<const double> got, std::span<const double> want) {
    double e2 = 0, r2 = 0, g2 = 0, dot = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      e2 += (got[i] - want[i]) * (got[i] - want[i]);
      r2 += want[i] * want[i];
      g2 += got[i] * got[i];
      dot += got[i] * want[i];
    }
    err_ += e2;
    ref_ += r2;
    per_head_.push_back(std::sqrt(e2 / r2));
    min_cosine_ = std::min(min_cosine_, g2 > 0 && r2 > 0 ? dot / std::sqrt(g2 * r2) : 1.0);
  }

  double rel_l2() const { return std::sqrt(err_ / ref_); }
  double min_cosine() const { return min_cosine_; }
  // REQUIRES: at least one head added.
  double rel_l2_p99() const {
    std::vector<double> sorted = per_head_;
    std::sort(sorted.begin(), sorted.end());
    return sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
  }

 private:
  double err_ = 0, ref_ = 0, min_cosine_ = 1;
  std::vector<double> per_head_;
};

}  // namespace kvp::bench
