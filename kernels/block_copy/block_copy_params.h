// Whole-block copies (docs/design.md §5): gather/scatter between the arena and a contiguous staging
// buffer, the unit NCCL transfers move, and moves from one arena into another (a migration between
// pools whose arenas this process maps). A block spans all layers, so each is one copy. nvcc-safe.
#pragma once

#include <cstdint>

namespace kvp {

struct BlockCopyParams {
  uint8_t* arena = nullptr;            // block b at arena + b · block_stride
  int64_t num_arena_blocks = 0;        // valid ids are [0, num_arena_blocks)
  int64_t block_stride = 0;            // bytes, a multiple of 256 (BlockLayout)
  const int32_t* block_ids = nullptr;  // [num_blocks]
  int32_t num_blocks = 0;
  uint8_t* staging = nullptr;  // [num_blocks, block_stride] bytes
};

// Block source_ids[i] of `source` onto block target_ids[i] of `target`, both arenas of one layout.
struct BlockMoveParams {
  const uint8_t* source = nullptr;
  int64_t num_source_blocks = 0;
  uint8_t* target = nullptr;
  int64_t num_target_blocks = 0;
  int64_t block_stride = 0;  // bytes, a multiple of 256 (BlockLayout)
  const int32_t* source_ids = nullptr;  // [num_blocks]
  const int32_t* target_ids = nullptr;  // [num_blocks]
  int32_t num_blocks = 0;
};

}  // namespace kvp
