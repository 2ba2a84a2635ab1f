#include "tests/testing/test_data.h"

#include <algorithm>
#include <numeric>

namespace kvp::testing {

std::vector<Bf16> RandomBf16(std::mt19937_64& rng, size_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<Bf16> out(n);
  for (Bf16& x : out) x = Bf16FromFloat(normal(rng));
  return out;
}

void TieAtTheKth(std::span<float> scores, int stride, int k) {
  std::vector<int> order(stride);
  for (size_t first = 0; first + stride <= scores.size(); first += stride) {
    float* row = scores.data() + first;
    std::iota(order.begin(), order.end(), 0);
    std::nth_element(order.begin(), order.begin() + k, order.end(),
                     [&](int a, int b) { return row[a] > row[b]; });
    float kth = row[order[0]];
    for (int i = 1; i < k; ++i) kth = std::min(kth, row[order[i]]);
    row[order[k]] = kth;
  }
}

}  // namespace kvp::testing
