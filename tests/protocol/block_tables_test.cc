// A held table's running hash must always equal the hash of the whole table, however it got there:
// kvpoold and the worker each keep one, and a step's hash is checked against the other side's.
#include "protocol/block_tables.h"

#include <random>

#include "gtest/gtest.h"

namespace kvp {
namespace {

TEST(BlockTablesTest, HeldHashIsTheWholeTablesHashAfterAppendsAndCuts) {
  std::mt19937 rng(7);
  HeldBlockTable held;
  std::vector<int32_t> mirror;
  EXPECT_EQ(held.hash(), BlockTableHash(mirror));
  for (int step = 0; step < 500; ++step) {
    const size_t keep = rng() % 4 == 0 ? rng() % (mirror.size() + 1) : mirror.size();
    std::vector<int32_t> tail(rng() % 3);
    for (int32_t& b : tail) b = static_cast<int32_t>(rng() % 1000);
    held.Replace(keep, tail);
    mirror.resize(keep);
    mirror.insert(mirror.end(), tail.begin(), tail.end());
    ASSERT_EQ(std::vector<int32_t>(held.blocks().begin(), held.blocks().end()), mirror);
    ASSERT_EQ(held.hash(), BlockTableHash(mirror)) << "step " << step;
  }
}

TEST(BlockTablesTest, HashTellsOrderLengthAndContentApart) {
  const std::vector<std::vector<int32_t>> tables = {{}, {0}, {0, 0}, {1, 2}, {2, 1}, {1, 2, 0}};
  for (size_t i = 0; i < tables.size(); ++i) {
    for (size_t j = i + 1; j < tables.size(); ++j) {
      EXPECT_NE(BlockTableHash(tables[i]), BlockTableHash(tables[j])) << i << " vs " << j;
    }
  }
}

TEST(BlockTablesTest, CommonPrefixOfGrownCutAndChangedTables) {
  const std::vector<int32_t> a = {4, 7, 9};
  EXPECT_EQ(CommonPrefix(a, std::vector<int32_t>{4, 7, 9, 3}), 3u);
  EXPECT_EQ(CommonPrefix(a, std::vector<int32_t>{4, 7}), 2u);
  EXPECT_EQ(CommonPrefix(a, std::vector<int32_t>{4, 5, 9}), 1u);
  EXPECT_EQ(CommonPrefix(a, std::vector<int32_t>{}), 0u);
  EXPECT_EQ(CommonPrefix(std::vector<int32_t>{}, a), 0u);
}

}  // namespace
}  // namespace kvp
