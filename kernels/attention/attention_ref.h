// The CPU core shared by the dense and sparse decode references: softmax attention of one
// sequence's query heads over an explicit list of positions, in double precision.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/attention/attention_params.h"

namespace kvp {

// INVALID_ARGUMENT for shapes the kernels cannot take (null pointers, q heads not a multiple of
// kv heads, negative τ or sequence lengths longer than the block table).
absl::Status ValidateAttentionParams(const AttentionParams& p);

// Writes out[seq] = softmax attention over `positions` (each < seq_lens[seq], distinct), with the
// sparse-V rule of AttentionParams. An empty list gives zeros. OUT_OF_RANGE for a block id
// outside the arena.
absl::Status AttendPositionsRef(const AttentionParams& p, int seq,
                                std::span<const int32_t> positions);

}  // namespace kvp
