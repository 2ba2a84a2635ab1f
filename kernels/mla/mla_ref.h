// CPU references of the MLA cache write and sparse MLA decode (kernels/mla/mla_params.h): the
// definitions the CUDA kernels are checked against.
#pragma once

#include "absl/status/status.h"
#include "kernels/mla/mla_params.h"

namespace kvp {

// Writes each token's 656 bytes (and its index key, layers with an indexer) at its slot.
// OUT_OF_RANGE for a slot outside the arena.
absl::Status MlaCacheWriteRef(const MlaCacheWriteParams& p);

// OUT_OF_RANGE for a position past its row's block table (top-k selects inside the sequence).
absl::Status SlotsOfPositionsRef(const SlotsOfPositionsParams& p);

// OUT_OF_RANGE for a slot outside [-1, the arena's slots); INVALID_ARGUMENT for a row naming a
// slot twice, or shapes that are not positive. Sums in double, output rounded to bf16 once.
absl::Status SparseMlaDecodeRef(const SparseMlaDecodeParams& p);

}  // namespace kvp
