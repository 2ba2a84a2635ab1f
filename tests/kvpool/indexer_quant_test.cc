#include "kvpool/format/indexer_quant.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace kvp {
namespace {

TEST(IndexerQuantTest, Ue8m0ScalesAreExactPowersOfTwoNoSmallerThanAmaxOver448) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> log_sigma(-12.0f, 6.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    std::normal_distribution<float> normal(0.0f, std::exp2(log_sigma(rng)));
    float k[kIndexHeadDim];
    float amax = 0.0f;
    for (float& x : k) {
      x = normal(rng);
      amax = std::max(amax, std::fabs(x));
    }
    uint8_t values[kIndexHeadDim];
    float s;
    IndexerEncode(k, /*ue8m0=*/true, values, &s);
    int exp;
    EXPECT_EQ(std::frexp(s, &exp), 0.5f) << s;  // a power of two
    EXPECT_GE(s, std::max(amax, kIndexerMinAmax) / 448.0f);
    EXPECT_LT(s, 2.0f * std::max(amax, kIndexerMinAmax) / 448.0f);
  }
}

TEST(IndexerQuantTest, WithoutUe8m0TheScaleIsAmaxOver448) {
  float k[kIndexHeadDim] = {};
  k[17] = -3.5f;
  uint8_t values[kIndexHeadDim];
  float s;
  IndexerEncode(k, /*ue8m0=*/false, values, &s);
  EXPECT_EQ(s, 3.5f / 448.0f);
  EXPECT_EQ(values[17], 0xFE);  // -448
  EXPECT_EQ(values[0], 0x00);
}

TEST(IndexerQuantTest, NanOfEitherKindIsLeftOutOfTheScale) {
  // A signalling NaN (quiet bit clear, as in bf16 0x7F81 widened) before the largest element and
  // a quiet one after it: the scale is the one of the other values, the NaNs keep their signs.
  const float signalling = BitsToFloat(0xFF810000u), quiet = BitsToFloat(0x7FC00000u);
  float k[kIndexHeadDim] = {};
  k[3] = -7.0f;
  k[5] = signalling;
  k[9] = 2.0f;
  k[40] = quiet;
  uint8_t values[kIndexHeadDim];
  float s;
  IndexerEncode(k, /*ue8m0=*/false, values, &s);
  EXPECT_EQ(s, 7.0f / 448.0f);
  EXPECT_EQ(values[3], 0xFE);  // -448
  EXPECT_EQ(values[5], 0xFF);
  EXPECT_EQ(values[40], 0x7F);
}

TEST(IndexerQuantTest, TheLargestElementDecodesWithinOneE4m3Step) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (bool ue8m0 : {true, false}) {
    for (int trial = 0; trial < 1000; ++trial) {
      float k[kIndexHeadDim];
      int arg = 0;
      for (int i = 0; i < kIndexHeadDim; ++i) {
        k[i] = normal(rng);
        if (std::fabs(k[i]) > std::fabs(k[arg])) arg = i;
      }
      uint8_t values[kIndexHeadDim];
      float s, back[kIndexHeadDim];
      IndexerEncode(k, ue8m0, values, &s);
      IndexerDecode(values, s, back);
      // One E4M3 step at |k / s| in [2^e, 2^(e+1)) is 2^(e-3), times s.
      int e;
      std::frexp(std::fabs(k[arg]) / s, &e);
      const float step = std::ldexp(1.0f, e - 1 - 3) * s;
      EXPECT_LE(std::fabs(back[arg] - k[arg]), step) << trial;
    }
  }
}

TEST(IndexerQuantTest, AllZeroKeyUsesTheFloorScale) {
  float k[kIndexHeadDim] = {};
  uint8_t values[kIndexHeadDim];
  float s;
  IndexerEncode(k, false, values, &s);
  EXPECT_EQ(s, kIndexerMinAmax / 448.0f);
  for (uint8_t v : values) EXPECT_EQ(v, 0);
}

}  // namespace
}  // namespace kvp
