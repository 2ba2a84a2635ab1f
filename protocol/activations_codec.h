// Activations on the wire: the new tokens' K/V/index K a cache write consumes, and the queries of
// a decode step, per layer. Checks name the layer and tensor that is wrong; decoding copies the
// values out of the message.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/format/bf16.h"
#include "kvpool/layout/pool_spec.h"
#include "protocol/kvpool.capnp.h"
#include "protocol/spec_codec.h"

namespace kvp {

// Per layer, row-major: k and v [tokens, kv_heads, head_dim], index_k [tokens, 128] (pools with an
// indexer; empty otherwise). An MLA pool's k is [tokens, 576], each token's latent then its RoPE
// values (the wire's latent and rope tensors joined), and v is empty.
struct TokenActivations {
  std::vector<std::vector<Bf16>> k, v, index_k;
};

// Per layer: q [q_heads, head_dim] (MLA pools: [q_heads, 576]), and for pools with an indexer
// index_q [64, 128] and head_weights [64].
struct StepQueries {
  std::vector<std::vector<Bf16>> q, index_q;
  std::vector<std::vector<float>> head_weights;
};

// INVALID_ARGUMENT unless `in` holds one tensor per layer of the shapes above for `tokens` tokens
// (MLA pools: latent [tokens, 512] and rope [tokens, 64], no k or v; KV pools: no latent or rope).
absl::Status CheckActivations(wire::Activations::Reader in, const PoolSpec& spec, uint32_t tokens);
absl::Status CheckQueries(wire::Queries::Reader in, const PoolSpec& spec, const ModelConfig& model);

absl::StatusOr<TokenActivations> ActivationsFromWire(wire::Activations::Reader in,
                                                     const PoolSpec& spec, uint32_t tokens);
absl::StatusOr<StepQueries> QueriesFromWire(wire::Queries::Reader in, const PoolSpec& spec,
                                            const ModelConfig& model);

// REQUIRES: the activations have the shapes above.
void ActivationsToWire(const TokenActivations& a, const PoolSpec& spec, uint32_t tokens,
                       wire::Activations::Builder out);
void QueriesToWire(const StepQueries& q, const PoolSpec& spec, const ModelConfig& model,
                   wire::Queries::Builder out);

// Rows [first, first + count) of every tensor of `in` (checked for `first + count` or more
// tokens): what a prefill job writes after its prefix hits.
void CopyActivationRows(wire::Activations::Reader in, uint32_t first, uint32_t count,
                        wire::Activations::Builder out);

}  // namespace kvp
