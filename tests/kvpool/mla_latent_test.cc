// The fp8_ds_mla latent cache format (kvpool/format/mla_latent.h), byte by byte against its
// definition: tile scales, E4M3 codes, the RoPE bf16 values, their offsets, and the edge cases.
#include "kvpool/format/mla_latent.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/mla_codec.h"

namespace kvp {
namespace {

std::vector<float> RandomToken(std::mt19937& rng, float spread = 1.0f) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> t(kMlaInputDim);
  for (float& x : t) x = normal(rng);
  return t;
}

float ScaleAt(const std::vector<uint8_t>& bytes, int tile) {
  float s;
  std::memcpy(&s, bytes.data() + 512 + 4 * tile, 4);
  return s;
}

TEST(MlaLatentTest, ATokenIs656BytesLaidOutAsDefined) {
  std::mt19937 rng(1);
  std::vector<float> token = RandomToken(rng);
  token[5] = 3.0f;       // tile 0's largest magnitude
  token[300] = -7.25f;   // tile 2's
  std::vector<uint8_t> out(kMlaTokenBytes, 0xAB);
  EncodeMlaToken(token.data(), out.data());
  for (int t = 0; t < 4; ++t) {
    float amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(token[t * 128 + i]));
    EXPECT_EQ(ScaleAt(out, t), amax / 448.0f) << "tile " << t;  // float32, no power of two
    for (int i = 0; i < 128; ++i) {
      const int v = t * 128 + i;
      ASSERT_EQ(out[v], E4m3FromFloat(token[v] / (amax / 448.0f))) << "value " << v;
    }
  }
  EXPECT_EQ(out[5], kE4m3MaxCode) << "a tile's largest value is ±448";
  EXPECT_EQ(out[300], 0x80 | kE4m3MaxCode);
  for (int i = 0; i < 64; ++i) {
    uint16_t bits;
    std::memcpy(&bits, out.data() + 528 + 2 * i, 2);
    EXPECT_EQ(bits, Bf16FromFloat(token[512 + i]).bits) << "RoPE value " << i;
  }
}

TEST(MlaLatentTest, RoPEValuesRoundToNearestEven) {
  std::vector<float> token(kMlaInputDim, 0.0f);
  token[512] = 1.0f + 0x1p-8f;      // halfway between 1 and the next bf16: stays 1
  token[513] = 1.0f + 3 * 0x1p-8f;  // halfway, odd below: rounds up
  token[514] = -2.5f;
  std::vector<uint8_t> out(kMlaTokenBytes);
  EncodeMlaToken(token.data(), out.data());
  std::vector<float> back(kMlaInputDim);
  DecodeMlaToken(out.data(), back.data());
  EXPECT_EQ(back[512], 1.0f);
  EXPECT_EQ(back[513], 1.0f + 4 * 0x1p-8f);
  EXPECT_EQ(back[514], -2.5f);
}

TEST(MlaLatentTest, ZeroTilesTakeTheSmallestNormalScale) {
  std::vector<float> token(kMlaInputDim, 0.0f);
  std::vector<uint8_t> out(kMlaTokenBytes);
  EncodeMlaToken(token.data(), out.data());
  for (int t = 0; t < 4; ++t) EXPECT_EQ(ScaleAt(out, t), FLT_MIN);
  for (int v = 0; v < 512; ++v) ASSERT_EQ(out[v], 0);
  // A tile of tiny values: amax / 448 under FLT_MIN, so FLT_MIN.
  token[130] = 1e-38f;
  EncodeMlaToken(token.data(), out.data());
  EXPECT_EQ(ScaleAt(out, 1), FLT_MIN);
}

TEST(MlaLatentTest, NanIsKeptAndIgnoredByTheScale) {
  std::vector<float> token(kMlaInputDim, 1.0f);
  token[7] = std::nanf("");
  token[8] = 2.0f;
  std::vector<uint8_t> out(kMlaTokenBytes);
  EncodeMlaToken(token.data(), out.data());
  EXPECT_EQ(ScaleAt(out, 0), 2.0f / 448.0f);
  EXPECT_EQ(out[7], kE4m3NanCode);
  EXPECT_EQ(out[8], kE4m3MaxCode);
  std::vector<float> back(kMlaInputDim);
  DecodeMlaToken(out.data(), back.data());
  EXPECT_TRUE(std::isnan(back[7]));
  EXPECT_EQ(back[8], 2.0f);
}

TEST(MlaLatentTest, EveryNanIsCode0x7FAndAnInfinityMakesItsTileNan) {
  std::vector<float> token(kMlaInputDim, 1.0f);
  token[0] = -std::nanf("");
  token[200] = -std::numeric_limits<float>::infinity();
  std::vector<uint8_t> out(kMlaTokenBytes);
  EncodeMlaToken(token.data(), out.data());
  EXPECT_EQ(out[0], kE4m3NanCode) << "a negative NaN too";
  EXPECT_TRUE(std::isinf(ScaleAt(out, 1)));
  EXPECT_EQ(out[200], kE4m3NanCode) << "inf / inf";
  EXPECT_EQ(out[201], 0) << "1 / inf";
}

// MlaQuotient stands in for the division of every value of a tile whose scale it allows: the same
// code always, and the same float wherever the code could depend on its last bit. Scales over the
// whole allowed range; values of any bits, and values just around m·s for E4M3's values and
// midpoints m (the ties), as a tile's values are (|x| <= 448 s).
TEST(MlaLatentTest, TheQuotientWithoutDivisionCodesAsTheDivision) {
  std::mt19937_64 rng(11);
  const auto bits_of = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  };
  const auto float_of = [](uint32_t b) {
    float x;
    std::memcpy(&x, &b, 4);
    return x;
  };
  const uint32_t lowest = bits_of(kMlaQuotientMinScale), highest = bits_of(FLT_MAX / kE4m3Max);
  int64_t checked = 0;
  for (int i = 0; i < 6'000'000; ++i) {
    const float s = float_of(lowest + static_cast<uint32_t>(rng() % (highest - lowest + 1)));
    float x;
    if (i % 3 == 0) {
      x = float_of(static_cast<uint32_t>(rng()));
    } else {
      // m with a 5-bit significand: every E4M3 value and midpoint, within a few ulps of m·s.
      const float m =
          std::ldexp(static_cast<float>(rng() % 32 + 16), static_cast<int>(rng() % 21) - 18);
      x = float_of(bits_of(m * s) + static_cast<uint32_t>(rng() % 5) - 2u);
      if (rng() % 2 == 0) x = -x;
    }
    if (!std::isfinite(x) || std::fabs(x) > kE4m3Max * s) continue;
    const float exact = x / s, fast = MlaQuotient(x, s, MlaReciprocal(s));
    ASSERT_EQ(MlaLatentCode(x, s), E4m3FromFloat(fast)) << std::hexfloat << x << " / " << s;
    if (std::fabs(exact) >= 0x1p-10f) {
      ASSERT_EQ(bits_of(exact), bits_of(fast)) << std::hexfloat << x << " / " << s;
    }
    ++checked;
  }
  EXPECT_GT(checked, 3'000'000);
  // Zeros keep their sign; NaN stays NaN.
  EXPECT_TRUE(std::signbit(MlaQuotient(-0.0f, 1.0f, 1.0f)));
  EXPECT_TRUE(std::isnan(MlaQuotient(NAN, 3.0f, MlaReciprocal(3.0f))));
}

TEST(MlaLatentTest, DecodingGivesEachCodeTimesItsScale) {
  std::mt19937 rng(2);
  const std::vector<float> token = RandomToken(rng, 5.0f);
  std::vector<uint8_t> out(kMlaTokenBytes);
  EncodeMlaToken(token.data(), out.data());
  std::vector<float> back(kMlaInputDim);
  DecodeMlaToken(out.data(), back.data());
  for (int v = 0; v < 512; ++v) {
    ASSERT_EQ(back[v], E4m3ToFloat(out[v]) * ScaleAt(out, v / 128)) << v;
  }
}

TEST(MlaLatentTest, WholeRunsRoundTripWithinE4m3Precision) {
  std::mt19937 rng(3);
  std::vector<float> values;
  for (int t = 0; t < 64; ++t) {
    const std::vector<float> token = RandomToken(rng, 0.5f + t);
    values.insert(values.end(), token.begin(), token.end());
  }
  absl::StatusOr<std::vector<uint8_t>> bytes = EncodeMlaTokens(values);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 64u * 656);
  absl::StatusOr<RoundTripStats> stats = MeasureMlaRoundTrip(values);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->vectors, 64);
  EXPECT_EQ(stats->bytes_per_vector, 656);
  // E4M3 keeps 3 mantissa bits: a relative error of at most 2^-4 per value, about 1e-3 in MSE.
  EXPECT_LT(stats->relative_mse, 2e-3);
  EXPECT_GT(stats->relative_mse, 1e-5);
  EXPECT_EQ(EncodeMlaTokens(absl::MakeConstSpan(values).subspan(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeMlaTokens(absl::MakeConstSpan(*bytes).subspan(3)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
