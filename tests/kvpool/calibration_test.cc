#include "kvpool/format/calibration.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

std::vector<float> Gaussian(size_t n, float sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool IsPowerOfTwo(float x) {
  int e;
  return std::frexp(x, &e) == 0.5f;
}

TEST(CalibrationTest, SmallVKeepsTurboAccuracyWithTheCalibratedScale) {
  // σ = 1e-3: at v_scale 1 the group scales are mostly E4M3 subnormals.
  const std::vector<float> v = Gaussian(512 * 128, 1e-3f, 1);
  const CalibrationResult r = CalibrateScale(v, 128, KvFormat::kTurbo3, true);
  EXPECT_GT(r.relative_mse_at_one, 0.5);
  EXPECT_LT(r.relative_mse, 0.04);  // turbo3's own error at unit scale is about 0.025
  EXPECT_LE(r.scale, 1.0f / 64);    // group scales of about 1e-3 must land in the normal range
  EXPECT_TRUE(IsPowerOfTwo(r.scale));
  // The same V at unit magnitude needs no scale.
  const CalibrationResult unit =
      CalibrateScale(Gaussian(512 * 128, 1.0f, 2), 128, KvFormat::kTurbo3, true);
  EXPECT_LT(unit.relative_mse, 0.04);
  EXPECT_NEAR(unit.relative_mse, unit.relative_mse_at_one, 0.002);
}

TEST(CalibrationTest, KScaleAvoidsSubnormalsAndSaturation) {
  const CalibrationResult tiny =
      CalibrateScale(Gaussian(256 * 128, 1e-4f, 3), 128, KvFormat::kFp8E4m3, false);
  EXPECT_GT(tiny.relative_mse_at_one, 10 * tiny.relative_mse);
  EXPECT_LT(tiny.scale, 1.0f);
  const CalibrationResult huge =
      CalibrateScale(Gaussian(256 * 128, 2000.0f, 4), 128, KvFormat::kFp8E4m3, false);
  EXPECT_GT(huge.scale, 1.0f) << "values past 448 would saturate at scale 1";
  EXPECT_LT(huge.relative_mse, 0.01);
}

TEST(CalibrationTest, FormatsWithoutAScaleKeepOne) {
  const CalibrationResult r =
      CalibrateScale(Gaussian(64 * 128, 1e-3f, 5), 128, KvFormat::kBf16, false);
  EXPECT_EQ(r.scale, 1.0f);
}

}  // namespace
}  // namespace kvp
