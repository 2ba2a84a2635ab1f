#include "kernels/attention/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/host_dot.h"

namespace kvp {

absl::Status ValidateAttentionParams(const AttentionParams& p) {
  const LayerCache& c = p.cache;
  if (p.num_seqs < 0) return absl::InvalidArgumentError("num_seqs < 0");
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.q == nullptr || p.block_tables == nullptr || p.seq_lens == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("attention needs q, block_tables, seq_lens and out");
  }
  if (c.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_q_heads = ", p.num_q_heads, " is not a multiple of num_kv_heads = ", c.num_kv_heads));
  }
  if (!(p.sparse_v_threshold >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_v_threshold = ", p.sparse_v_threshold, "; must be >= 0"));
  }
  for (int s = 0; s < p.num_seqs; ++s) {
    const int64_t capacity = int64_t{p.block_table_stride} * c.block_size;
    if (p.seq_lens[s] < 0 || p.seq_lens[s] > capacity) {
      return absl::InvalidArgumentError(absl::StrCat(
          "seq_lens[", s, "] = ", p.seq_lens[s], "; the block table holds ", capacity, " tokens"));
    }
  }
  return absl::OkStatus();
}

absl::Status AttendPositionsRef(const AttentionParams& p, int seq,
                                std::span<const int32_t> positions) {
  const LayerCache& c = p.cache;
  const int d = c.head_dim;
  const int group = p.num_q_heads / c.num_kv_heads;
  const int32_t* table = p.block_tables + int64_t{seq} * p.block_table_stride;
  const size_t n = positions.size();

  // Dequantize the selected rows once per kv head: K in the value domain, V in the storage
  // domain (rotated for TurboNV), so the inverse rotation runs once per output.
  std::vector<float> keys(n * d);
  std::vector<float> values(n * d);
  std::vector<double> scores(n);
  std::vector<double> acc(d);
  std::vector<float> q(d);
  for (int g = 0; g < c.num_kv_heads; ++g) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t pos = positions[i];
      const int32_t block = table[pos / c.block_size];
      if (!c.ValidBlock(block)) {
        return absl::OutOfRangeError(absl::StrCat("block table of sequence ", seq, " names block ",
                                                  block, " at position ", pos, "; the arena has ",
                                                  c.num_blocks, " blocks"));
      }
      const int slot = pos % c.block_size;
      DecodeHead(c.k_codec, c.K(block, slot, g), nullptr, d, &keys[i * d]);
      DecodeHeadStored(c.v_codec, c.VData(block, slot, g), c.VScale(block, slot, g), d,
                       &values[i * d]);
    }
    for (int qh = g * group; qh < (g + 1) * group; ++qh) {
      const Bf16* q_bf16 = p.q + (int64_t{seq} * p.num_q_heads + qh) * d;
      for (int e = 0; e < d; ++e) q[e] = Bf16ToFloat(q_bf16[e]);
      double max_score = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < n; ++i) {
        const double dot = DotF64(q.data(), &keys[i * d], d);
        scores[i] = dot * p.softmax_scale;
        max_score = std::max(max_score, scores[i]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double denominator = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const double weight = std::exp(scores[i] - max_score);
        denominator += weight;
        if (weight <= p.sparse_v_threshold) continue;  // sparse-V: counted, not loaded
        for (int e = 0; e < d; ++e) acc[e] += weight * values[i * d + e];
      }
      if (StoredRotated(c.v_codec)) RotateInverse(acc.data(), d, c.v_codec.signs);
      float* out = p.out + (int64_t{seq} * p.num_q_heads + qh) * d;
      for (int e = 0; e < d; ++e) out[e] = n == 0 ? 0.0f : static_cast<float>(acc[e] / denominator);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp
