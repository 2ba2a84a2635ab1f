// The host backend's executor: the CPU reference kernels over a host arena mapping.
#pragma once

#include <cstdint>

#include "kvpool/layout/block_layout.h"
#include "worker/executor.h"

namespace kvp {

class HostExecutor : public Executor {
 public:
  // REQUIRES: base..base + num_blocks · block_stride is mapped and outlives the executor.
  HostExecutor(BlockLayout layout, uint8_t* base, JobContext ctx);

  absl::Status Prefill(const PrefillWork& work) override;
  absl::StatusOr<std::vector<DecodeStepResult>> Decode(const DecodeWork& work) override;
  absl::Status MoveBlocksFrom(const uint8_t* source, int64_t source_blocks,
                              const std::vector<BlockCopyPair>& moves) override;

 private:
  void Copy(const std::vector<BlockCopyPair>& copies);

  BlockLayout layout_;
  uint8_t* base_;
  JobContext ctx_;
};

}  // namespace kvp
