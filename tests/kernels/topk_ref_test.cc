#include "kernels/topk/topk_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

std::vector<int32_t> RunTopk(const std::vector<float>& row, int32_t length, int k) {
  std::vector<int32_t> out(k, -7);
  TopkParams p;
  p.scores = row.data();
  p.lengths = &length;
  p.indices = out.data();
  p.scores_stride = static_cast<int32_t>(row.size());
  p.num_rows = 1;
  p.k = k;
  EXPECT_TRUE(TopkRef(p).ok());
  return out;
}

// The contract, checked from scratch by a full sort of (score desc, index asc) over non-NaN.
std::vector<int32_t> Expected(const std::vector<float>& row, int32_t length, int k) {
  std::vector<int32_t> order;
  for (int32_t i = 0; i < length; ++i) {
    if (!std::isnan(row[i])) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  if (static_cast<int>(order.size()) > k) order.resize(k);
  std::sort(order.begin(), order.end());
  order.resize(k, -1);
  return order;
}

TEST(TopkRefTest, SelectsTheLargestScoresOfRandomRows) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (int k : {1, 7, 256, 2048}) {
    std::vector<float> row(5000);
    for (float& x : row) x = normal(rng);
    const int32_t length = 4000;
    EXPECT_EQ(RunTopk(row, length, k), Expected(row, length, k)) << k;
  }
}

TEST(TopkRefTest, AShortRowGivesEveryPositionThenMinusOne) {
  std::vector<float> row = {3.0f, -kInf, 1.0f, 9.0f, 2.0f, 5.0f};
  const std::vector<int32_t> out = RunTopk(row, 4, 6);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, -1, -1}));
  EXPECT_EQ(RunTopk(row, 0, 3), (std::vector<int32_t>{-1, -1, -1}));
}

TEST(TopkRefTest, TiesBreakTowardTheLowerPosition) {
  std::vector<float> row(100, 1.0f);
  row[40] = 2.0f;
  row[70] = -0.0f;
  row[71] = 0.0f;
  EXPECT_EQ(RunTopk(row, 100, 3), (std::vector<int32_t>{0, 1, 40}));
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> few(0, 3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> ties(3000);
    for (float& x : ties) x = static_cast<float>(few(rng));
    EXPECT_EQ(RunTopk(ties, 3000, 512), Expected(ties, 3000, 512));
  }
  std::vector<float> zeros = {0.0f, -0.0f, 0.0f, -0.0f};
  EXPECT_EQ(RunTopk(zeros, 4, 2), (std::vector<int32_t>{0, 1}));  // -0 == +0
}

TEST(TopkRefTest, MinusInfinityRowsStillSelectKPositions) {
  std::vector<float> row(300, -kInf);
  EXPECT_EQ(RunTopk(row, 300, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  row[250] = -1e30f;
  EXPECT_EQ(RunTopk(row, 300, 2), (std::vector<int32_t>{0, 250}));
}

TEST(TopkRefTest, NanIsNeverSelected) {
  std::vector<float> row = {kNan, 1.0f, kNan, -kInf, 0.5f};
  EXPECT_EQ(RunTopk(row, 5, 2), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(RunTopk(row, 5, 4), (std::vector<int32_t>{1, 3, 4, -1}));
  std::vector<float> all_nan(10, kNan);
  EXPECT_EQ(RunTopk(all_nan, 10, 3), (std::vector<int32_t>{-1, -1, -1}));
}

TEST(TopkRefTest, RowsAreIndependent) {
  std::vector<float> scores = {5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};
  const int32_t lengths[2] = {6, 5};
  std::vector<int32_t> out(4, -7);
  TopkParams p{scores.data(), lengths, out.data(), 6, 2, 2};
  ASSERT_TRUE(TopkRef(p).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 3, 4}));
}

TEST(TopkRefTest, RejectsKOutOfRangeAndLongRows) {
  std::vector<float> row(10, 1.0f);
  int32_t length = 10;
  std::vector<int32_t> out(4096);
  TopkParams p{row.data(), &length, out.data(), 10, 1, 0};
  EXPECT_EQ(TopkRef(p).code(), absl::StatusCode::kInvalidArgument);
  p.k = kMaxTopk + 1;
  EXPECT_EQ(TopkRef(p).code(), absl::StatusCode::kInvalidArgument);
  p.k = 4;
  length = 11;
  EXPECT_EQ(TopkRef(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
