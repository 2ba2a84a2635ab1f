// PoolSpec and ModelConfig <-> wire: the one place the pool's shape and the decode model cross the
// protocol boundary.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/layout/pool_spec.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

// What decode jobs need beyond the pool's bytes: the attention's q heads, how many positions the
// indexer selects per layer, and the synthetic model's seed. kvpoold sets it; workers receive it.
struct ModelConfig {
  int num_q_heads = 32;
  int topk = 2048;
  uint64_t synthetic_seed = 0x6B76706F6F6Cull;
  // Per layer: > 0 attends to the last W positions only; empty: every layer attends to all.
  // Dense decode only (pools without an indexer): sparse decode attends to what top-k selects.
  std::vector<int> sliding_windows;
  float sparse_v_threshold = 0.0f;  // τ of sparse-V (docs/design.md §5); 0: exact dense softmax

  int Window(int layer) const { return sliding_windows.empty() ? 0 : sliding_windows[layer]; }
};

// INVALID_ARGUMENT unless q heads are a positive multiple of the spec's kv heads (at most 16 per
// kv head, docs/design.md §5), 1 <= topk <= kMaxTopk, the windows are none or one >= 0 per layer of
// a pool without an indexer, and τ is finite and >= 0.
absl::Status ValidateModelConfig(const ModelConfig& model, const PoolSpec& spec);

void ModelConfigToWire(const ModelConfig& model, wire::Model::Builder out);
ModelConfig ModelConfigFromWire(wire::Model::Reader in);

// The synthetic model of a pool: its generator settings and activation shapes.
SyntheticConfig SyntheticConfigOf(const ModelConfig& model);
SyntheticShape SyntheticShapeOf(const PoolSpec& spec, const ModelConfig& model);

// The synthetic model's per-step seed: a step's queries depend on its token and position, so
// equal histories (a fork and its source) give equal queries.
uint64_t SyntheticStepSeed(const SyntheticConfig& cfg, int32_t token, int64_t position);

void PoolSpecToWire(const PoolSpec& spec, wire::PoolSpec::Builder out);

// INVALID_ARGUMENT (or UNIMPLEMENTED) when the spec is not one ValidatePoolSpec accepts.
absl::StatusOr<PoolSpec> PoolSpecFromWire(wire::PoolSpec::Reader in);

}  // namespace kvp
