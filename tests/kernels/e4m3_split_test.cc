// The claims of kernels/common/e4m3_split.h, on the host: the scale a head gets, the exactness of
// its two-part E4M3 split, and how infinities and NaNs pass through.
#include "kernels/common/e4m3_split.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/bf16.h"
#include "kvpool/format/e4m3.h"

namespace kvp::e4m3_split {
namespace {

// The bits of two bf16 values as one word, the first in the low half.
uint32_t Pair(float a, float b) {
  return Bf16FromFloat(a).bits | (uint32_t{Bf16FromFloat(b).bits} << 16);
}

TEST(E4m3SplitTest, ScaleBringsTheLargestMagnitudeInto128To256) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int exponent = -118; exponent <= 127; ++exponent) {
    for (int i = 0; i < 20; ++i) {
      const float amax = std::ldexp(i == 0 ? 1.0f : mantissa(rng), exponent);
      const int e = ScaleExponent(amax);
      const float scaled = amax * Pow2(e);
      EXPECT_GE(scaled, 128.0f) << amax;
      EXPECT_LT(scaled, 256.0f) << amax;
      EXPECT_EQ(Pow2(e) * Pow2(-e), 1.0f) << amax;
    }
  }
  // Below 2^-118 the scale stops at 2^126 (its inverse stays a normal float); zero gets 1.
  EXPECT_EQ(ScaleExponent(std::ldexp(1.0f, -125)), 126);
  EXPECT_EQ(ScaleExponent(std::numeric_limits<float>::denorm_min()), 126);
  EXPECT_EQ(ScaleExponent(0.0f), 0);
  EXPECT_EQ(ScaleExponent(std::numeric_limits<float>::infinity()), 0);
  EXPECT_EQ(ScaleExponent(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(E4m3SplitTest, TheLargestMagnitudeKeepsInfinitiesAndNans) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint32_t> finite = {Pair(-3.0f, 0.5f), Pair(0.0f, -7.25f)};
  EXPECT_EQ(BitsToFloat(Bf16AbsMaxBits(finite.data(), 2)), 7.25f);
  const std::vector<uint32_t> with_inf = {Pair(-3.0f, 0.5f), Pair(-inf, -7.25f)};
  EXPECT_EQ(BitsToFloat(Bf16AbsMaxBits(with_inf.data(), 2)), inf);
  const std::vector<uint32_t> with_nan = {Pair(nan, 0.5f), Pair(-inf, -7.25f)};
  EXPECT_TRUE(std::isnan(BitsToFloat(Bf16AbsMaxBits(with_nan.data(), 2))));
}

// Heads of 128 bf16 values with magnitudes spread over 2^-40 .. 2^40 of a random base (and some
// zeros): every scaled value of magnitude 1/4 or more is exactly hi + lo, every smaller one within
// 2^-9.
TEST(E4m3SplitTest, HiPlusLoIsTheScaledValueExactly) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> spread(-40, 40), base(-60, 60);
  int exact = 0, small = 0;
  for (int head = 0; head < 400; ++head) {
    const int head_base = base(rng);
    std::vector<uint32_t> words(64);
    for (uint32_t& w : words) {
      float v[2];
      for (float& x : v) {
        x = std::ldexp(unit(rng), head_base + (head % 4 == 0 ? spread(rng) / 8 : spread(rng)));
        if (rng() % 16 == 0) x = 0.0f;
      }
      w = Pair(v[0], v[1]);
    }
    const float amax = BitsToFloat(Bf16AbsMaxBits(words.data(), 64));
    const float scale = Pow2(ScaleExponent(amax));
    for (int i = 0; i < 64; i += 2) {
      float x[4];  // the scaled values, as the reference sees them
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = words[i + j / 2];
        x[j] = Bf16ToFloat(Bf16{static_cast<uint16_t>(j % 2 ? w >> 16 : w & 0xFFFFu)}) * scale;
      }
      uint32_t hi, lo;
      SplitBf16x4(words[i], words[i + 1], scale, &hi, &lo);
      for (int j = 0; j < 4; ++j) {
        const double sum = double{E4m3ToFloat(static_cast<uint8_t>(hi >> (8 * j)))} +
                           E4m3ToFloat(static_cast<uint8_t>(lo >> (8 * j)));
        if (std::fabs(x[j]) >= 0.25f) {
          EXPECT_EQ(sum, x[j]) << "head " << head << " value " << i * 2 + j;
          ++exact;
        } else {
          EXPECT_LE(std::fabs(sum - x[j]), std::ldexp(1.0, -9)) << "head " << head;
          ++small;
        }
      }
    }
  }
  EXPECT_GT(exact, 10000);  // both regimes were exercised
  EXPECT_GT(small, 1000);
}

TEST(E4m3SplitTest, AnInfiniteValueSplitsIntoSaturatedHiAndNanLo) {
  const float inf = std::numeric_limits<float>::infinity();
  const float x[4] = {inf, -inf, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  uint32_t hi, lo;
  Split4(x, &hi, &lo);
  EXPECT_EQ(hi & 0xFFu, kE4m3MaxCode);
  EXPECT_EQ((hi >> 8) & 0xFFu, 0x80u | kE4m3MaxCode);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(lo & 0xFFu)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat((lo >> 8) & 0xFFu)));
  EXPECT_EQ(E4m3ToFloat((hi >> 16) & 0xFFu), 1.0f);
  EXPECT_EQ(E4m3ToFloat((lo >> 16) & 0xFFu), 0.0f);
  EXPECT_TRUE(std::isnan(E4m3ToFloat(hi >> 24)));
}

}  // namespace
}  // namespace kvp::e4m3_split
