// The synthetic model's activations (docs/design.md §6): a counter-based generator keyed by
// (seed, layer, stream, position, element), so any value can be recomputed anywhere, in any order,
// by the CPU or the GPU with identical bits. Integer hashing plus a sum of four 16-bit uniforms
// (Irwin-Hall, ≈ N(0, 1), bounded by ±√12); the float work is exact integer conversion and
// single-rounded multiplies and adds. Host and device.
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/bf16.h"

namespace kvp {

enum class SyntheticStream : uint32_t {
  kKey = 1,          // K [kv_heads, head_dim] per token
  kValue = 2,        // V [kv_heads, head_dim] per token
  kIndexKey = 3,     // index K [128] per token
  kQuery = 4,        // q [q_heads, head_dim] per decode step
  kIndexQuery = 5,   // index q [64, 128] per decode step
  kIndexWeight = 6,  // indexer head weights [64] per decode step
  kChannel = 7,      // per-channel properties (outlier channels of K)
};

KVP_HD uint64_t SyntheticMix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

KVP_HD uint64_t SyntheticHash(uint64_t seed, uint32_t layer, SyntheticStream stream,
                              uint32_t position, uint32_t element) {
  uint64_t h = SyntheticMix(seed);
  h = SyntheticMix(h ^ ((uint64_t{layer} << 32) | static_cast<uint32_t>(stream)));
  return SyntheticMix(h ^ ((uint64_t{position} << 32) | element));
}

// ≈ N(0, 1): (Σ of four 16-bit uniforms - 2 · 65535) · √3 / 65536; the sum is an exact integer.
KVP_HD float SyntheticNormal(uint64_t hash) {
  const int32_t sum =
      static_cast<int32_t>(hash & 0xFFFF) + static_cast<int32_t>((hash >> 16) & 0xFFFF) +
      static_cast<int32_t>((hash >> 32) & 0xFFFF) + static_cast<int32_t>(hash >> 48);
  return MulRn(static_cast<float>(sum - 2 * 65535), 2.6428898e-05f);
}

// Uniform in [0, 1) with 24 bits.
KVP_HD float SyntheticUniform(uint64_t hash) {
  return MulRn(static_cast<float>(hash >> 40), 5.9604645e-08f);
}

// How the synthetic model shapes its activations. Plain values; the same struct drives the CPU
// fill functions and the GPU generator.
struct SyntheticConfig {
  uint64_t seed = 0x6B76706F6F6Cull;
  float key_std = 1.0f;
  float value_std = 1.0f;
  float index_key_std = 1.0f;
  float query_std = 1.0f;
  // Real K caches have a few large channels; one in `outlier_period` K channels (per layer) is
  // `outlier_gain` times larger. 0 disables.
  uint32_t outlier_period = 16;
  float outlier_gain = 6.0f;
};

// The seed of a token: activations depend on the token id, so equal prefixes give equal caches.
KVP_HD uint64_t TokenSeed(const SyntheticConfig& cfg, int32_t token) {
  return SyntheticMix(cfg.seed ^ (uint64_t{static_cast<uint32_t>(token)} << 1));
}

KVP_HD float KeyChannelGain(const SyntheticConfig& cfg, uint32_t layer, uint32_t channel) {
  if (cfg.outlier_period == 0) return 1.0f;
  const uint64_t h = SyntheticHash(cfg.seed, layer, SyntheticStream::kChannel, 0, channel);
  return h % cfg.outlier_period == 0 ? cfg.outlier_gain : 1.0f;
}

// Element `element` of row `row` (a kv head, or 0 for index keys) of `stream` at `position` for
// token `token`: K, V or index K, as the cache write consumes them.
KVP_HD Bf16 SyntheticTokenValue(const SyntheticConfig& cfg, SyntheticStream stream, uint32_t layer,
                                int32_t token, uint32_t position, uint32_t row, uint32_t head_dim,
                                uint32_t element) {
  const uint64_t h =
      SyntheticHash(TokenSeed(cfg, token), layer, stream, position, row * head_dim + element);
  float x = SyntheticNormal(h);
  switch (stream) {
    case SyntheticStream::kKey:
      x = MulRn(MulRn(x, cfg.key_std), KeyChannelGain(cfg, layer, element));
      break;
    case SyntheticStream::kValue:
      x = MulRn(x, cfg.value_std);
      break;
    case SyntheticStream::kIndexKey:
      x = MulRn(x, cfg.index_key_std);
      break;
    default:
      break;
  }
  return Bf16FromFloat(x);
}

// A decode query element: noise, plus `needle_gain` times the needle's key element when the step
// plants a needle (needle_gain = 0: none). q = bf16(needle_gain · key + query_std · noise).
KVP_HD Bf16 SyntheticQueryValue(const SyntheticConfig& cfg, SyntheticStream stream, uint32_t layer,
                                uint64_t step_seed, uint32_t row, uint32_t head_dim,
                                uint32_t element, float needle_gain, Bf16 needle_key) {
  const uint64_t h = SyntheticHash(step_seed, layer, stream, 0, row * head_dim + element);
  const float noise = MulRn(SyntheticNormal(h), cfg.query_std);
  return Bf16FromFloat(AddRn(MulRn(needle_gain, Bf16ToFloat(needle_key)), noise));
}

// A positive indexer head weight in [0.5, 1.5) / √64.
KVP_HD float SyntheticIndexWeight(uint32_t layer, uint64_t step_seed, uint32_t head) {
  const uint64_t h = SyntheticHash(step_seed, layer, SyntheticStream::kIndexWeight, 0, head);
  return MulRn(AddRn(SyntheticUniform(h), 0.5f), 0.125f);
}

}  // namespace kvp
