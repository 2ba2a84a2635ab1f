// An Executor runs checked jobs (worker/job.h) against an attached arena: the host backend with
// the CPU reference kernels, the cuda backend with the CUDA kernels. Both give the same bytes in
// the cache; attention outputs agree within the kernels' stated tolerances.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/job.h"

namespace kvp {

class Executor {
 public:
  virtual ~Executor() = default;
  // Copies, then writes every layer of the tokens into their slots.
  virtual absl::Status Prefill(const PrefillWork& work) = 0;
  // Copies, writes each step's token, then per layer indexer -> top-k -> sparse decode (dense
  // paged decode for pools without an indexer).
  virtual absl::StatusOr<std::vector<DecodeStepResult>> Decode(const DecodeWork& work) = 0;
  // A migration's copy: each move's block of `source` (another pool's arena of this layout with
  // `source_blocks` blocks, mapped by this process) onto its block here, whole. Returns when the
  // bytes are in place. OUT_OF_RANGE, copying nothing, for a block outside either arena.
  virtual absl::Status MoveBlocksFrom(const uint8_t* source, int64_t source_blocks,
                                      const std::vector<BlockCopyPair>& moves) = 0;
};

}  // namespace kvp
