#include "kvpool/format/turbo_quant.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/head_codec.h"
#include "kvpool/format/kv_format.h"

namespace kvp {
namespace {

// Relative MSE Σ(v̂ - v)² / Σ v² of encode + decode over `vectors` Gaussian token-heads of d = 128.
double RoundTripRelativeMse(KvFormat format, float sigma, int vectors, bool rotate,
                            const std::vector<float>& channel_gain, uint64_t seed) {
  constexpr int d = 128;
  HeadCodec codec{format, 1.0f, rotate, true, MakeRotationSigns(d)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  const FormatTraits traits = TraitsOf(format);
  std::vector<uint8_t> data(traits.DataBytes(d)), scales(traits.ScaleBytes(d));
  float v[d], back[d];
  double err = 0.0, ref = 0.0;
  for (int i = 0; i < vectors; ++i) {
    for (int j = 0; j < d; ++j) v[j] = normal(rng) * channel_gain[j];
    EncodeHead(codec, v, d, data.data(), scales.data());
    DecodeHead(codec, data.data(), scales.data(), d, back);
    for (int j = 0; j < d; ++j) {
      err += double(back[j] - v[j]) * (back[j] - v[j]);
      ref += double(v[j]) * v[j];
    }
  }
  return err / ref;
}

struct MseBand {
  KvFormat format;
  double lo, hi;
};

TEST(TurboQuantTest, RelativeMseOfGaussianDataIsInTheExpectedBand) {
  const std::vector<float> unit(128, 1.0f);
  constexpr int kVectors = 100000 / 8 + 1;  // >= 1e5 groups of 16 per sigma
  for (const MseBand& band :
       {MseBand{KvFormat::kTurbo2, 0.122, 0.136}, MseBand{KvFormat::kTurbo3, 0.0228, 0.0256},
        MseBand{KvFormat::kTurbo4, 0.0054, 0.0064}}) {
    for (float sigma : {0.03f, 0.1f, 0.3f, 1.0f, 3.0f, 10.0f}) {
      const double mse = RoundTripRelativeMse(band.format, sigma, kVectors, true, unit, 7);
      EXPECT_GE(mse, band.lo) << "format " << int(band.format) << " sigma " << sigma;
      EXPECT_LE(mse, band.hi) << "format " << int(band.format) << " sigma " << sigma;
    }
  }
}

TEST(TurboQuantTest, RotationHelpsOnOutlierChannels) {
  std::vector<float> gains(128, 1.0f);
  for (int j = 0; j < 128; j += 16) gains[j + 3] = 20.0f;  // one large channel per group
  for (KvFormat f : {KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4}) {
    const double rotated = RoundTripRelativeMse(f, 1.0f, 2000, true, gains, 3);
    const double plain = RoundTripRelativeMse(f, 1.0f, 2000, false, gains, 3);
    EXPECT_LT(rotated, 0.8 * plain) << int(f);
  }
}

TEST(TurboQuantTest, RotationIsOrthonormalAndInverts) {
  for (int d : {64, 128, 256}) {
    const RotationSigns signs = MakeRotationSigns(d);
    std::vector<std::vector<float>> columns(d, std::vector<float>(d, 0.0f));
    for (int i = 0; i < d; ++i) {
      columns[i][i] = 1.0f;
      RotateForward(columns[i].data(), d, signs);
    }
    for (int i = 0; i < d; i += 7) {
      for (int j = 0; j < d; j += 5) {
        double dot = 0.0;
        for (int e = 0; e < d; ++e) dot += double(columns[i][e]) * columns[j][e];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << d << " " << i << " " << j;
      }
    }
    std::mt19937 rng(d);
    std::normal_distribution<float> normal;
    std::vector<float> v(d), y(d);
    for (float& x : v) x = normal(rng);
    y = v;
    RotateForward(y.data(), d, signs);
    RotateInverse(y.data(), d, signs);
    for (int e = 0; e < d; ++e) EXPECT_NEAR(y[e], v[e], 1e-5f);
  }
}

TEST(TurboQuantTest, RotationSignsFollowTheSplitMixRecipe) {
  // sign_j = -1 when bit 63 of the j-th splitmix64 output from 0x6B76706F6F6C0000 + d is set.
  for (int d : {64, 128, 256}) {
    const RotationSigns signs = MakeRotationSigns(d);
    uint64_t state = 0x6B76706F6F6C0000ull + d;
    int negatives = 0;
    for (int j = 0; j < d; ++j) {
      state += 0x9E3779B97F4A7C15ull;
      uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      EXPECT_EQ(signs.Negative(j), (z >> 63) == 1) << d << " " << j;
      negatives += signs.Negative(j);
    }
    EXPECT_GT(negatives, d / 4);
    EXPECT_LT(negatives, 3 * d / 4);
  }
}

template <int kBits>
void ExpectEveryCodePacksAndUnpacks() {
  for (int code = 0; code < (1 << kBits); ++code) {
    for (int pos = 0; pos < kTurboGroupSize; ++pos) {
      uint8_t codes[kTurboGroupSize], back[kTurboGroupSize];
      for (int i = 0; i < kTurboGroupSize; ++i) codes[i] = (i * 5 + 3) % (1 << kBits);
      codes[pos] = static_cast<uint8_t>(code);
      uint8_t packed[kTurboGroupBytes<kBits>];
      TurboPackGroup<kBits>(codes, packed);
      TurboUnpackGroup<kBits>(packed, back);
      for (int i = 0; i < kTurboGroupSize; ++i) ASSERT_EQ(back[i], codes[i]);
      // Little-endian bit stream: code `pos` sits at bits [N·pos, N·pos + N).
      uint64_t stream = 0;
      for (int b = 0; b < kTurboGroupBytes<kBits>; ++b) stream |= uint64_t{packed[b]} << (8 * b);
      ASSERT_EQ((stream >> (kBits * pos)) & ((1u << kBits) - 1), static_cast<uint64_t>(code));
    }
  }
}

TEST(TurboQuantTest, EveryCodePacksAndUnpacks) {
  ExpectEveryCodePacksAndUnpacks<2>();
  ExpectEveryCodePacksAndUnpacks<3>();
  ExpectEveryCodePacksAndUnpacks<4>();
  static_assert(kTurboGroupBytes<2> == 4 && kTurboGroupBytes<3> == 6 && kTurboGroupBytes<4> == 8);
}

template <int kBits>
void ExpectZeroGroupDecodesToZeros() {
  float zeros[kTurboGroupSize] = {};
  uint8_t packed[kTurboGroupBytes<kBits>];
  uint8_t scale = 0xAA;
  TurboEncodeGroup<kBits>(zeros, 1.0f, packed, &scale);
  EXPECT_EQ(scale, 0);
  uint8_t codes[kTurboGroupSize];
  TurboUnpackGroup<kBits>(packed, codes);
  for (uint8_t c : codes) EXPECT_EQ(c, 1u << (kBits - 1));
  float y[kTurboGroupSize];
  TurboDecodeGroup<kBits>(packed, scale, 1.0f, y);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(TurboQuantTest, ZeroGroupDecodesToZeros) {
  ExpectZeroGroupDecodesToZeros<2>();
  ExpectZeroGroupDecodesToZeros<3>();
  ExpectZeroGroupDecodesToZeros<4>();
}

TEST(TurboQuantTest, GroupFollowsTheDesignArithmetic) {
  // A hand-checked turbo2 group: max |x| = 2 maps to c_max; codes by boundary count (ties up);
  // s = ‖x‖ / ‖C[codes]‖.
  float x[kTurboGroupSize] = {2.0f, -2.0f, 0.0f, 0.3f, -0.3f, 1.0f, -1.0f, 0.5f,
                              0.0f, 0.0f,  0.0f, 0.0f, 0.0f,  0.0f, 0.0f,  0.0f};
  uint8_t packed[4], scale;
  TurboEncodeGroup<2>(x, 1.0f, packed, &scale);
  uint8_t codes[kTurboGroupSize];
  TurboUnpackGroup<2>(packed, codes);
  // u = x · 1.5104 / 2: 1.5104, -1.5104, 0, 0.2266, -0.2266, 0.7552, -0.7552, 0.3776.
  // Boundaries: -0.9816, 0, 0.9816.
  const uint8_t expected[kTurboGroupSize] = {3, 0, 2, 2, 1, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  for (int i = 0; i < kTurboGroupSize; ++i) EXPECT_EQ(codes[i], expected[i]) << i;
  float sum_c2 = 0.0f, sum_x2 = 0.0f;
  for (int i = 0; i < kTurboGroupSize; ++i) {
    sum_c2 = std::fma(TurboCodebook<2>::Level(codes[i]), TurboCodebook<2>::Level(codes[i]), sum_c2);
    sum_x2 = std::fma(x[i], x[i], sum_x2);
  }
  EXPECT_EQ(scale, E4m3FromFloat(std::sqrt(sum_x2) / std::sqrt(sum_c2)));
  // v_scale divides the stored scale.
  uint8_t scaled;
  TurboEncodeGroup<2>(x, 0.25f, packed, &scaled);
  EXPECT_EQ(scaled, E4m3FromFloat(std::sqrt(sum_x2) / std::sqrt(sum_c2) / 0.25f));
}

}  // namespace
}  // namespace kvp
