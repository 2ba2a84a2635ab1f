#include "kvpool/format/e4m3.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "kvpool/format/bf16.h"

namespace kvp {
namespace {

// Independent decode from the OCP definition, in double.
double DecodeE4m3Spec(int code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 15;
  const int mant = code & 7;
  const double magnitude = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(1.0 + mant / 8.0, exp - 7);
  return sign ? -magnitude : magnitude;
}

bool IsNanCode(int code) { return (code & 0x7F) == 0x7F; }

TEST(E4m3Test, AllCodesDecodeToTheirOcpValues) {
  for (int code = 0; code < 256; ++code) {
    const float f = E4m3ToFloat(static_cast<uint8_t>(code));
    if (IsNanCode(code)) {
      EXPECT_TRUE(std::isnan(f)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(f), DecodeE4m3Spec(code)) << code;
      EXPECT_EQ(std::signbit(f), code >= 128) << code;
    }
  }
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3Test, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (IsNanCode(code)) continue;
    EXPECT_EQ(E4m3FromFloat(E4m3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
}

// Nearest finite code by exhaustive search; ties go to the even code (even mantissa).
uint8_t NearestEvenByScan(float x) {
  int best = -1;
  double best_dist = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    if (IsNanCode(code) || (code >> 7) != (std::signbit(x) ? 1 : 0)) continue;
    const double dist = std::fabs(DecodeE4m3Spec(code) - static_cast<double>(x));
    if (dist < best_dist || (dist == best_dist && (code & 1) == 0)) {
      best = code;
      best_dist = dist;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(E4m3Test, EncodingRoundsToNearestEvenLikeAnExhaustiveScan) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.0f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(exponent(rng));
    if (x > 448.0f) continue;
    if (i & 1) x = -x;
    ASSERT_EQ(E4m3FromFloat(x), NearestEvenByScan(x)) << x;
  }
}

TEST(E4m3Test, ExactMidpointsGoToTheEvenCode) {
  for (int code = 0; code < 0x7E; ++code) {
    const double lo = DecodeE4m3Spec(code);
    const double hi = DecodeE4m3Spec(code + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);  // exactly representable
    EXPECT_EQ(E4m3FromFloat(mid), (code & 1) ? code + 1 : code) << "between " << code;
    EXPECT_EQ(E4m3FromFloat(std::nextafter(mid, 1e9f)), code + 1);
    EXPECT_EQ(E4m3FromFloat(std::nextafter(mid, -1e9f)), code);
  }
}

TEST(E4m3Test, SaturatesToPlusMinus448) {
  EXPECT_EQ(E4m3FromFloat(448.0f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(464.0f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(1e30f), 0x7E);
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(E4m3FromFloat(-500.0f), 0xFE);
  EXPECT_EQ(E4m3FromFloat(-std::numeric_limits<float>::infinity()), 0xFE);
}

TEST(E4m3Test, KeepsNanAndItsSign) {
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(E4m3FromFloat(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
}

TEST(E4m3Test, TinyValuesFlushToSignedZeroBelowHalfTheSmallestSubnormal) {
  EXPECT_EQ(E4m3FromFloat(std::ldexp(1.0f, -10)), 0x00);  // tie with 0 and 2^-9: even is 0
  EXPECT_EQ(E4m3FromFloat(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(E4m3FromFloat(-1e-30f), 0x80);
  EXPECT_EQ(E4m3FromFloat(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(Bf16FromFloat(1.0f).bits, 0x3F80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even (1.0) wins; a hair above goes up.
  EXPECT_EQ(Bf16FromFloat(1.00390625f).bits, 0x3F80);
  EXPECT_EQ(Bf16FromFloat(std::nextafter(1.00390625f, 2.0f)).bits, 0x3F81);
  // 1 + 3·2^-8 is halfway between 0x3F81 and 0x3F82: even (0x3F82) wins.
  EXPECT_EQ(Bf16FromFloat(1.01171875f).bits, 0x3F82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(Bf16FromFloat(std::nanf("")))));
  EXPECT_EQ(Bf16ToFloat(Bf16FromFloat(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace kvp
