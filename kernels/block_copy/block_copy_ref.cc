#include "kernels/block_copy/block_copy_ref.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

absl::Status ValidateBlockCopy(const BlockCopyParams& p) {
  if (p.num_blocks > 0 && (p.arena == nullptr || p.block_ids == nullptr || p.staging == nullptr)) {
    return absl::InvalidArgumentError("block copy needs arena, block_ids and staging");
  }
  for (int32_t i = 0; i < p.num_blocks; ++i) {
    if (p.block_ids[i] < 0 || p.block_ids[i] >= p.num_arena_blocks) {
      return absl::OutOfRangeError(absl::StrCat("block_ids[", i, "] = ", p.block_ids[i],
                                                "; the arena has ", p.num_arena_blocks, " blocks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBlockMove(const BlockMoveParams& p) {
  if (p.num_blocks > 0 && (p.source == nullptr || p.target == nullptr ||
                           p.source_ids == nullptr || p.target_ids == nullptr)) {
    return absl::InvalidArgumentError("block move needs source, target and both id lists");
  }
  for (int32_t i = 0; i < p.num_blocks; ++i) {
    if (p.source_ids[i] < 0 || p.source_ids[i] >= p.num_source_blocks) {
      return absl::OutOfRangeError(absl::StrCat("source_ids[", i, "] = ", p.source_ids[i],
                                                "; the source has ", p.num_source_blocks,
                                                " blocks"));
    }
    if (p.target_ids[i] < 0 || p.target_ids[i] >= p.num_target_blocks) {
      return absl::OutOfRangeError(absl::StrCat("target_ids[", i, "] = ", p.target_ids[i],
                                                "; the target has ", p.num_target_blocks,
                                                " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status MoveBlocksRef(const BlockMoveParams& p) {
  if (auto s = ValidateBlockMove(p); !s.ok()) return s;
  for (int32_t i = 0; i < p.num_blocks; ++i) {
    std::memcpy(p.target + p.target_ids[i] * p.block_stride,
                p.source + p.source_ids[i] * p.block_stride, p.block_stride);
  }
  return absl::OkStatus();
}

absl::Status GatherBlocksRef(const BlockCopyParams& p) {
  if (auto s = ValidateBlockCopy(p); !s.ok()) return s;
  for (int32_t i = 0; i < p.num_blocks; ++i) {
    std::memcpy(p.staging + i * p.block_stride, p.arena + p.block_ids[i] * p.block_stride,
                p.block_stride);
  }
  return absl::OkStatus();
}

absl::Status ScatterBlocksRef(const BlockCopyParams& p) {
  if (auto s = ValidateBlockCopy(p); !s.ok()) return s;
  for (int32_t i = 0; i < p.num_blocks; ++i) {
    std::memcpy(p.arena + p.block_ids[i] * p.block_stride, p.staging + i * p.block_stride,
                p.block_stride);
  }
  return absl::OkStatus();
}

}  // namespace kvp
