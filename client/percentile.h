// The p-th quantile (0 <= p <= 1, nearest rank) of samples, for the client's benchmark reports.
#pragma once

#include <algorithm>
#include <vector>

namespace kvp {

inline double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t rank = static_cast<size_t>(p * (samples.size() - 1) + 0.5);
  return samples[std::min(samples.size() - 1, rank)];
}

}  // namespace kvp
