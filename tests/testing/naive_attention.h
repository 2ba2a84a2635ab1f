// The textbook attention the reference kernels are checked against: dequantize one sequence's
// whole cache to value-domain float rows (inverse rotation per row), then an FP64 softmax over
// the positions a mask allows. Deliberately slow and simple.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvpool/format/bf16.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp::testing {

struct DenseSequence {
  int len = 0;
  std::vector<float> k;  // [len, kv_heads, d]
  std::vector<float> v;  // [len, kv_heads, d]
};

// REQUIRES: every position < len has a valid block in `table`.
DenseSequence Dequantize(const LayerCache& c, const int32_t* table, int len);

// out [q_heads, d] = Σ_p softmax(scale · q·k_p) v_p over positions with allowed(p); positions
// whose exp(logit - max) <= sparse_v_threshold stay in the denominator but add no V.
std::vector<double> NaiveAttention(const DenseSequence& seq, const Bf16* q, int num_q_heads,
                                   int num_kv_heads, int d, float scale,
                                   const std::function<bool(int)>& allowed,
                                   float sparse_v_threshold = 0.0f);

// ‖a - b‖₂ / ‖b‖₂.
double RelativeL2(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace kvp::testing
