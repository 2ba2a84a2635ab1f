#include "bench/fp8_math_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/attention_ref.h"
#include "kvpool/format/e4m3.h"
#include "kvpool/format/head_codec.h"

namespace kvp::bench {
namespace {

// The power of two that maps the largest |x| of `values` to at most E4M3's largest finite value.
float E4m3RangeScale(const std::vector<float>& values) {
  float max_abs = 0.0f;
  for (float x : values) max_abs = std::max(max_abs, std::fabs(x));
  if (max_abs == 0.0f) return 1.0f;
  int exponent = 0;
  std::frexp(max_abs / kE4m3Max, &exponent);  // max_abs / 448 < 2^exponent
  return std::ldexp(1.0f, exponent);
}

void RoundToE4m3(std::vector<float>& values, float scale) {
  for (float& x : values) x = E4m3ToFloat(E4m3FromFloat(x / scale)) * scale;
}

}  // namespace

absl::Status Fp8MathAttention(const AttentionParams& p, Fp8Operands operands) {
  RETURN_IF_ERROR(ValidateAttentionParams(p));
  const LayerCache& c = p.cache;
  if (c.k_codec.format != KvFormat::kFp8E4m3 && operands.any()) {
    return absl::InvalidArgumentError("FP8 tensor math needs an fp8_e4m3 K cache");
  }
  const int d = c.head_dim;
  const int group = p.num_q_heads / c.num_kv_heads;
  for (int seq = 0; seq < p.num_seqs; ++seq) {
    const int n = p.seq_lens[seq];
    const int32_t* table = p.block_tables + int64_t{seq} * p.block_table_stride;
    std::vector<float> keys(size_t(n) * d), values(size_t(n) * d), q(d), weights(n);
    std::vector<double> acc(d);
    for (int g = 0; g < c.num_kv_heads; ++g) {
      for (int i = 0; i < n; ++i) {
        const int32_t block = table[i / c.block_size];
        if (!c.ValidBlock(block)) {
          return absl::OutOfRangeError(absl::StrCat("block table of sequence ", seq,
                                                    " names block ", block, "; the arena has ",
                                                    c.num_blocks));
        }
        const int slot = i % c.block_size;
        DecodeHead(c.k_codec, c.K(block, slot, g), nullptr, d, &keys[size_t(i) * d]);
        DecodeHeadStored(c.v_codec, c.VData(block, slot, g), c.VScale(block, slot, g), d,
                         &values[size_t(i) * d]);
      }
      if (operands.v) RoundToE4m3(values, E4m3RangeScale(values));
      for (int qh = g * group; qh < (g + 1) * group; ++qh) {
        const Bf16* q_bf16 = p.q + (int64_t{seq} * p.num_q_heads + qh) * d;
        for (int e = 0; e < d; ++e) q[e] = Bf16ToFloat(q_bf16[e]);
        if (operands.q) RoundToE4m3(q, E4m3RangeScale(q));
        float max_score = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < n; ++i) {
          float dot = 0.0f;
          for (int e = 0; e < d; ++e) dot += q[e] * keys[size_t(i) * d + e];
          weights[i] = dot * p.softmax_scale;
          max_score = std::max(max_score, weights[i]);
        }
        double denominator = 0.0;
        for (float& w : weights) {
          w = std::exp(w - max_score);
          denominator += w;
        }
        if (operands.p) RoundToE4m3(weights, 1.0f / 256);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int i = 0; i < n; ++i) {
          for (int e = 0; e < d; ++e) acc[e] += double{weights[i]} * values[size_t(i) * d + e];
        }
        if (StoredRotated(c.v_codec)) RotateInverse(acc.data(), d, c.v_codec.signs);
        float* out = p.out + (int64_t{seq} * p.num_q_heads + qh) * d;
        for (int e = 0; e < d; ++e)
          out[e] = n == 0 ? 0.0f : static_cast<float>(acc[e] / denominator);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp::bench
