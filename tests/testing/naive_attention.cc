#include "tests/testing/naive_attention.h"

#include <cmath>
#include <limits>

namespace kvp::testing {

DenseSequence Dequantize(const LayerCache& c, const int32_t* table, int len) {
  DenseSequence seq;
  seq.len = len;
  const int d = c.head_dim;
  seq.k.resize(static_cast<size_t>(len) * c.num_kv_heads * d);
  seq.v.resize(seq.k.size());
  for (int p = 0; p < len; ++p) {
    const int32_t block = table[p / c.block_size];
    const int slot = p % c.block_size;
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const size_t row = (static_cast<size_t>(p) * c.num_kv_heads + h) * d;
      DecodeHead(c.k_codec, c.K(block, slot, h), nullptr, d, &seq.k[row]);
      DecodeHead(c.v_codec, c.VData(block, slot, h), c.VScale(block, slot, h), d, &seq.v[row]);
    }
  }
  return seq;
}

std::vector<double> NaiveAttention(const DenseSequence& seq, const Bf16* q, int num_q_heads,
                                   int num_kv_heads, int d, float scale,
                                   const std::function<bool(int)>& allowed,
                                   float sparse_v_threshold) {
  std::vector<double> out(static_cast<size_t>(num_q_heads) * d, 0.0);
  const int group = num_q_heads / num_kv_heads;
  auto row = [&](int p, int g) { return (static_cast<size_t>(p) * num_kv_heads + g) * d; };
  std::vector<double> logits(seq.len);
  for (int qh = 0; qh < num_q_heads; ++qh) {
    const int g = qh / group;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int p = 0; p < seq.len; ++p) {
      if (!allowed(p)) {
        logits[p] = -std::numeric_limits<double>::infinity();
        continue;
      }
      double dot = 0.0;
      for (int e = 0; e < d; ++e) {
        dot += double{Bf16ToFloat(q[qh * d + e])} * seq.k[row(p, g) + e];
      }
      logits[p] = dot * scale;
      max_logit = std::max(max_logit, logits[p]);
    }
    if (std::isinf(max_logit)) continue;  // nothing allowed: zeros
    double denominator = 0.0;
    for (int p = 0; p < seq.len; ++p) denominator += std::exp(logits[p] - max_logit);
    for (int p = 0; p < seq.len; ++p) {
      const double e = std::exp(logits[p] - max_logit);
      if (e == 0.0 || e <= sparse_v_threshold) continue;
      const double w = e / denominator;
      for (int i = 0; i < d; ++i) out[qh * d + i] += w * seq.v[row(p, g) + i];
    }
  }
  return out;
}

double RelativeL2(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return std::sqrt(err / ref);
}

}  // namespace kvp::testing
