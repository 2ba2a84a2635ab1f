// The synthetic model of a pool (docs/design.md §5): its generator's settings and activation
// shapes, from the pool spec and the model configuration. Host code; the generator itself is
// synthetic_fill.h (CPU) and synthetic_launch.h (CUDA).
#pragma once

#include <cstdint>

#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/layout/pool_spec.h"
#include "kvpool/model/model_config.h"

namespace kvp {

SyntheticConfig SyntheticConfigOf(const ModelConfig& model);
SyntheticShape SyntheticShapeOf(const PoolSpec& spec, const ModelConfig& model);

// The synthetic model's per-step seed: a step's queries depend on its token and position, so
// equal histories (a fork and its source) give equal queries.
uint64_t SyntheticStepSeed(const SyntheticConfig& cfg, int32_t token, int64_t position);

}  // namespace kvp
