// CPU reference of block gather (arena -> staging), scatter (staging -> arena) and move (arena ->
// arena).
#pragma once

#include "absl/status/status.h"
#include "kernels/block_copy/block_copy_params.h"

namespace kvp {

// OUT_OF_RANGE naming the first bad block id; nothing is copied then.
absl::Status GatherBlocksRef(const BlockCopyParams& p);
absl::Status ScatterBlocksRef(const BlockCopyParams& p);
absl::Status MoveBlocksRef(const BlockMoveParams& p);
// OUT_OF_RANGE naming the first id outside its arena.
absl::Status ValidateBlockMove(const BlockMoveParams& p);

}  // namespace kvp
