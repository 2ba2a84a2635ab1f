#include "kernels/block_copy/block_copy_ref.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

TEST(BlockCopyRefTest, GatherThenScatterMovesWholeBlocks) {
  constexpr int64_t kStride = 512, kBlocks = 10;
  std::vector<uint8_t> arena(kStride * kBlocks), target(kStride * kBlocks, 0xEE);
  std::mt19937 rng(std::random_device{}());
  for (uint8_t& b : arena) b = static_cast<uint8_t>(rng());
  std::vector<int32_t> ids = {7, 2, 9};
  std::vector<uint8_t> staging(ids.size() * kStride, 0xCC);
  BlockCopyParams gather{arena.data(), kBlocks, kStride, ids.data(), 3, staging.data()};
  ASSERT_TRUE(GatherBlocksRef(gather).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(std::equal(staging.begin() + i * kStride, staging.begin() + (i + 1) * kStride,
                           arena.begin() + ids[i] * kStride));
  }
  std::vector<int32_t> dest = {0, 5, 1};
  BlockCopyParams scatter{target.data(), kBlocks, kStride, dest.data(), 3, staging.data()};
  ASSERT_TRUE(ScatterBlocksRef(scatter).ok());
  for (int64_t b = 0; b < kBlocks; ++b) {
    const auto it = std::find(dest.begin(), dest.end(), b);
    for (int64_t i = 0; i < kStride; ++i) {
      const uint8_t expected =
          it == dest.end() ? 0xEE : arena[ids[it - dest.begin()] * kStride + i];
      ASSERT_EQ(target[b * kStride + i], expected) << "block " << b << " byte " << i;
    }
  }
}

TEST(BlockCopyRefTest, OutOfRangeIdsAreRejectedBeforeAnyCopy) {
  std::vector<uint8_t> arena(256 * 2, 1), staging(256 * 2, 0);
  std::vector<int32_t> ids = {1, 2};
  BlockCopyParams p{arena.data(), 2, 256, ids.data(), 2, staging.data()};
  EXPECT_EQ(GatherBlocksRef(p).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(staging[0], 0);
  ids[1] = -1;
  EXPECT_EQ(ScatterBlocksRef(p).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(arena[256], 1);
}

TEST(BlockCopyRefTest, MoveCopiesBlocksBetweenArenasAndChecksBothSides) {
  constexpr int64_t kStride = 256;
  std::vector<uint8_t> source(kStride * 6), target(kStride * 4, 0xEE);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<int32_t> from = {5, 0, 3}, to = {2, 3, 0};
  BlockMoveParams p{.source = source.data(), .num_source_blocks = 6, .target = target.data(),
                    .num_target_blocks = 4, .block_stride = kStride, .source_ids = from.data(),
                    .target_ids = to.data(), .num_blocks = 3};
  ASSERT_TRUE(MoveBlocksRef(p).ok());
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_TRUE(std::equal(target.begin() + to[i] * kStride, target.begin() + (to[i] + 1) * kStride,
                           source.begin() + from[i] * kStride));
  }
  EXPECT_EQ(target[1 * kStride], 0xEE);  // block 1 was not a target
  to[1] = 4;  // past the target
  EXPECT_EQ(MoveBlocksRef(p).code(), absl::StatusCode::kOutOfRange);
  to[1] = 3;
  from[2] = 6;  // past the source
  EXPECT_EQ(MoveBlocksRef(p).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace kvp
