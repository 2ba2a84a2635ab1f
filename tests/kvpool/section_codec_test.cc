#include "kvpool/format/section_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/head_codec.h"

namespace kvp {
namespace {

std::vector<float> Gaussian(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(SectionCodecTest, DataRowsComeFirstThenScaleRows) {
  SectionCodecOptions o{KvFormat::kTurbo3, 64, 0.5f, true, true};
  const std::vector<float> values = Gaussian(3 * 64, 1);
  const std::vector<uint8_t> bytes = EncodeSections(o, values).value();
  ASSERT_EQ(bytes.size(), 3u * (24 + 4));
  const HeadCodec codec{KvFormat::kTurbo3, 0.5f, true, true, MakeRotationSigns(64)};
  for (int i = 0; i < 3; ++i) {
    uint8_t data[24], scales[4];
    EncodeHead(codec, values.data() + i * 64, 64, data, scales);
    EXPECT_EQ(std::memcmp(bytes.data() + i * 24, data, 24), 0) << i;
    EXPECT_EQ(std::memcmp(bytes.data() + 3 * 24 + i * 4, scales, 4), 0) << i;
  }
}

TEST(SectionCodecTest, IndexerIsValuesThenFloatScales) {
  SectionCodecOptions o{KvFormat::kIndexer, 128, 1.0f, true, true};
  std::vector<float> values(2 * 128, 0.0f);
  values[5] = 7.0f;     // scale 7/448 rounded up to 2^-6
  values[128] = -1.0f;  // scale 1/448 rounded up to 2^-8
  const std::vector<uint8_t> bytes = EncodeSections(o, values).value();
  ASSERT_EQ(bytes.size(), 2u * 132);
  float s0, s1;
  std::memcpy(&s0, bytes.data() + 256, 4);
  std::memcpy(&s1, bytes.data() + 260, 4);
  EXPECT_EQ(s0, 0.015625f);
  EXPECT_EQ(s1, 0.00390625f);
  EXPECT_EQ(bytes[5], E4m3FromFloat(7.0f / 0.015625f));
  EXPECT_EQ(bytes[128], E4m3FromFloat(-256.0f));
}

TEST(SectionCodecTest, EveryFormatRoundTripsWithinItsError) {
  struct Case {
    KvFormat format;
    double max_relative_mse;
  };
  for (const Case& c : {Case{KvFormat::kBf16, 1e-5}, Case{KvFormat::kFp8E4m3, 2e-3},
                        Case{KvFormat::kTurbo2, 0.14}, Case{KvFormat::kTurbo3, 0.027},
                        Case{KvFormat::kTurbo4, 0.0066}, Case{KvFormat::kIndexer, 2e-3}}) {
    for (int d : {64, 128, 256}) {
      if (c.format == KvFormat::kIndexer && d != 128) continue;
      const SectionCodecOptions o{c.format, d, 1.0f, true, true};
      const std::vector<float> values = Gaussian(200 * d, d);
      const RoundTripStats stats = MeasureRoundTrip(o, values).value();
      EXPECT_EQ(stats.vectors, 200);
      EXPECT_LE(stats.relative_mse, c.max_relative_mse) << int(c.format) << " d=" << d;
      EXPECT_GT(stats.relative_mse, 0.0);
      EXPECT_NEAR(stats.snr_db, -10 * std::log10(stats.relative_mse), 1e-9);
      // Decoding the encoded bytes twice gives the same floats: the format is a function.
      const auto bytes = EncodeSections(o, values).value();
      EXPECT_EQ(DecodeSections(o, bytes).value(), DecodeSections(o, bytes).value());
      EXPECT_EQ(EncodeSections(o, DecodeSections(o, bytes).value()).value().size(), bytes.size());
    }
  }
}

TEST(SectionCodecTest, RejectsWhatTheFormatCannotHold) {
  std::vector<float> values(128, 1.0f);
  values[130 - 128] = std::numeric_limits<float>::infinity();
  const SectionCodecOptions turbo{KvFormat::kTurbo2, 128, 1.0f, true, true};
  EXPECT_EQ(EncodeSections(turbo, values).status().code(), absl::StatusCode::kInvalidArgument);
  SectionCodecOptions fp8 = turbo;
  fp8.format = KvFormat::kFp8E4m3;
  EXPECT_EQ(EncodeSections(fp8, values).status().code(), absl::StatusCode::kInvalidArgument);
  values[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(EncodeSections(fp8, values).ok());  // E4M3 holds NaN
  EXPECT_EQ(EncodeSections(turbo, values).status().code(), absl::StatusCode::kInvalidArgument);
  SectionCodecOptions bf16 = turbo;
  bf16.format = KvFormat::kBf16;
  EXPECT_TRUE(EncodeSections(bf16, values).ok());
}

TEST(SectionCodecTest, RejectsBadShapesAndOptions) {
  const std::vector<float> values(100, 1.0f);
  SectionCodecOptions o{KvFormat::kTurbo4, 64, 1.0f, true, true};
  EXPECT_EQ(EncodeSections(o, values).status().code(), absl::StatusCode::kInvalidArgument);
  o.head_dim = 96;
  EXPECT_EQ(EncodeSections(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o.head_dim = 64;
  o.scale = 0.0f;
  EXPECT_EQ(EncodeSections(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = {KvFormat::kIndexer, 64, 1.0f, true, true};
  EXPECT_EQ(EncodeSections(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
  o = {KvFormat::kTurbo3, 128, 1.0f, true, true};
  const std::vector<uint8_t> odd(57);
  EXPECT_EQ(DecodeSections(o, odd).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
