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

}  // namespace
}  // namespace kvp
