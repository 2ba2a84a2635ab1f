// The jobs a worker executes (docs/design.md §6), decoded from the wire and checked against the
// arena before any kernel runs: a job naming a block, slot or position outside what it may touch is
// refused with a typed error, never executed.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/layout/pool_spec.h"
#include "protocol/activations_codec.h"
#include "protocol/block_tables.h"
#include "protocol/kvpool.capnp.h"
#include "protocol/outputs_codec.h"
#include "protocol/spec_codec.h"

namespace kvp {

// Copy whole block `first` onto block `second` (copy-on-write of a shared partial block).
using BlockCopyPair = std::pair<int32_t, int32_t>;

struct PrefillWork {
  uint64_t sequence = 0;
  std::vector<int32_t> tokens;  // the tokens to write
  int64_t first_position = 0;   // position of tokens[0]
  std::vector<int64_t> slots;   // one per token
  std::vector<BlockCopyPair> copies;
  std::optional<TokenActivations> activations;  // absent: synthetic
};

struct DecodeStepWork {
  uint64_t sequence = 0;
  int32_t token = 0;
  int64_t position = 0;  // of the new token; the step attends over positions [0, position]
  int64_t slot = 0;
  std::vector<int32_t> block_table;
  std::vector<BlockCopyPair> copies;
  std::optional<TokenActivations> activations;  // the new token's; absent: synthetic
  std::optional<StepQueries> queries;           // absent: synthetic
  std::optional<SyntheticNeedle> needle;        // synthetic queries only
};

struct DecodeWork {
  std::vector<DecodeStepWork> steps;
  wire::OutputLayers outputs = wire::OutputLayers::ALL;
};

// What jobs are checked against: the pool's shape, its block count and the model.
struct JobContext {
  PoolSpec spec;
  int64_t num_blocks = 0;
  ModelConfig model;
};

// The block table this worker holds for each sequence: decode jobs send only what changed
// (protocol/block_tables.h). One per registration with kvpoold.
using BlockTableCache = absl::flat_hash_map<uint64_t, HeldBlockTable>;

// Decoded and checked: OUT_OF_RANGE for a block id, slot or position outside the arena or the
// block table, INVALID_ARGUMENT for malformed tensors or lists.
absl::StatusOr<PrefillWork> PrefillWorkFromWire(wire::PrefillJob::Reader job,
                                                const JobContext& ctx);
// Rebuilds each step's block table from `tables` and the job's delta, and updates `tables`.
// ABORTED when a table cannot be rebuilt (kvpoold and this worker disagree on what it holds): the
// caller should clear `tables`, so that kvpoold's next job sends whole tables.
absl::StatusOr<DecodeWork> DecodeWorkFromWire(wire::DecodeJob::Reader job, const JobContext& ctx,
                                              BlockTableCache& tables);

}  // namespace kvp
