#include "kernels/synthetic/synthetic_fill.h"

#include <array>
#include <vector>

#include "kvpool/format/indexer_quant.h"

namespace kvp {

void FillSyntheticTokens(const SyntheticConfig& cfg, const SyntheticShape& shape, int layer,
                         std::span<const int32_t> tokens, int32_t first_position, Bf16* k, Bf16* v,
                         Bf16* index_k) {
  const uint32_t d = shape.head_dim;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const uint32_t pos = first_position + static_cast<uint32_t>(t);
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      const size_t row = (t * shape.num_kv_heads + h) * d;
      for (uint32_t e = 0; e < d; ++e) {
        k[row + e] =
            SyntheticTokenValue(cfg, SyntheticStream::kKey, layer, tokens[t], pos, h, d, e);
        if (v == nullptr) continue;
        v[row + e] =
            SyntheticTokenValue(cfg, SyntheticStream::kValue, layer, tokens[t], pos, h, d, e);
      }
    }
    if (index_k == nullptr) continue;
    for (uint32_t e = 0; e < kIndexHeadDim; ++e) {
      index_k[t * kIndexHeadDim + e] = SyntheticTokenValue(cfg, SyntheticStream::kIndexKey, layer,
                                                           tokens[t], pos, 0, kIndexHeadDim, e);
    }
  }
}

void FillSyntheticQuery(const SyntheticConfig& cfg, const SyntheticShape& shape, int layer,
                        uint64_t step_seed, const SyntheticNeedle* needle, Bf16* q) {
  const uint32_t d = shape.head_dim;
  const int group = shape.num_q_heads / shape.num_kv_heads;
  // The needle's keys, once per kv head (every q head of a group leans on the same one).
  std::vector<Bf16> keys(needle != nullptr ? size_t{d} * shape.num_kv_heads : 0);
  for (int g = 0; needle != nullptr && g < shape.num_kv_heads; ++g) {
    for (uint32_t e = 0; e < d; ++e) {
      keys[g * d + e] = SyntheticTokenValue(cfg, SyntheticStream::kKey, layer, needle->token,
                                            needle->position, g, d, e);
    }
  }
  const float gain = needle != nullptr ? needle->gain : 0.0f;
  for (int qh = 0; qh < shape.num_q_heads; ++qh) {
    const uint32_t kv_head = qh / group;
    for (uint32_t e = 0; e < d; ++e) {
      const Bf16 key = needle != nullptr ? keys[kv_head * d + e] : Bf16{0};
      q[qh * d + e] =
          SyntheticQueryValue(cfg, SyntheticStream::kQuery, layer, step_seed, qh, d, e, gain, key);
    }
  }
}

void FillSyntheticIndexQuery(const SyntheticConfig& cfg, int layer, uint64_t step_seed,
                             const SyntheticNeedle* needle, Bf16* index_q, float* weights) {
  std::array<Bf16, kIndexHeadDim> key{};
  for (uint32_t e = 0; needle != nullptr && e < kIndexHeadDim; ++e) {
    key[e] = SyntheticTokenValue(cfg, SyntheticStream::kIndexKey, layer, needle->token,
                                 needle->position, 0, kIndexHeadDim, e);
  }
  const float gain = needle != nullptr ? needle->gain : 0.0f;
  for (uint32_t h = 0; h < kIndexHeads; ++h) {
    for (uint32_t e = 0; e < kIndexHeadDim; ++e) {
      index_q[h * kIndexHeadDim + e] = SyntheticQueryValue(
          cfg, SyntheticStream::kIndexQuery, layer, step_seed, h, kIndexHeadDim, e, gain, key[e]);
    }
    weights[h] = SyntheticIndexWeight(layer, step_seed, h);
  }
}

}  // namespace kvp
