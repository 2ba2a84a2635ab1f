// Decode outputs on the wire: per step and returned layer, the attention output
// [q_heads, head_dim] float32, for pools with an indexer the selected positions [topk] int32 and,
// for MLA pools, each head's log-sum-exp [q_heads] float32.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

struct DecodeStepResult {
  uint64_t sequence = 0;
  int64_t length = 0;  // tokens after the step
  std::vector<std::vector<float>> out;     // per returned layer
  std::vector<std::vector<int32_t>> topk;  // per returned layer; empty without an indexer
  std::vector<std::vector<float>> lse;     // per returned layer; MLA pools only
};

// REQUIRES: every out has num_q_heads · head_dim values, every lse num_q_heads.
void DecodeResultsToWire(const std::vector<DecodeStepResult>& results, uint32_t num_q_heads,
                         uint32_t head_dim, capnp::List<wire::DecodeOutput>::Builder out);

// INVALID_ARGUMENT for a tensor of the wrong type or size.
absl::StatusOr<std::vector<DecodeStepResult>> DecodeResultsFromWire(
    capnp::List<wire::DecodeOutput>::Reader in);

}  // namespace kvp
