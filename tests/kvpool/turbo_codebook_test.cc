#include "kvpool/format/turbo_codebook.h"

#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double pdf(double x) { return std::isinf(x) ? 0.0 : std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }

template <int kBits>
std::vector<double> Levels() {
  std::vector<double> levels;
  for (int j = 0; j < TurboCodebook<kBits>::kLevels; ++j) {
    levels.push_back(TurboCodebook<kBits>::Level(j));
  }
  return levels;
}

// Cell j of the quantizer: [edge[j], edge[j + 1]) with midpoints between levels.
std::vector<double> Edges(const std::vector<double>& levels) {
  std::vector<double> edges = {-INFINITY};
  for (size_t j = 0; j + 1 < levels.size(); ++j) edges.push_back((levels[j] + levels[j + 1]) / 2);
  edges.push_back(INFINITY);
  return edges;
}

template <int kBits>
void ExpectLloydMaxFixedPoint() {
  const std::vector<double> levels = Levels<kBits>();
  const std::vector<double> edges = Edges(levels);
  for (size_t j = 0; j < levels.size(); ++j) {
    const double a = edges[j], b = edges[j + 1];
    const double conditional_mean = (pdf(a) - pdf(b)) / (Phi(b) - Phi(a));
    EXPECT_NEAR(levels[j], conditional_mean, 1e-3) << "N=" << kBits << " level " << j;
  }
}

template <int kBits>
double CodebookMse() {
  const std::vector<double> levels = Levels<kBits>();
  const std::vector<double> edges = Edges(levels);
  double mse = 0.0;
  for (size_t j = 0; j < levels.size(); ++j) {
    const double a = edges[j], b = edges[j + 1], c = levels[j];
    const double mass = Phi(b) - Phi(a);
    const double first = pdf(a) - pdf(b);                             // ∫ x φ
    const double second = mass - ((std::isinf(b) ? 0 : b * pdf(b)) -  // ∫ x² φ
                                  (std::isinf(a) ? 0 : a * pdf(a)));
    mse += second - 2 * c * first + c * c * mass;
  }
  return mse;
}

TEST(TurboCodebookTest, EachLevelIsTheGaussianMeanOfItsCell) {
  ExpectLloydMaxFixedPoint<2>();
  ExpectLloydMaxFixedPoint<3>();
  ExpectLloydMaxFixedPoint<4>();
}

TEST(TurboCodebookTest, CodebookMseMatchesLloydMax) {
  EXPECT_NEAR(CodebookMse<2>(), 0.1175, 0.1175 * 0.01);
  EXPECT_NEAR(CodebookMse<3>(), 0.03455, 0.03455 * 0.01);
  EXPECT_NEAR(CodebookMse<4>(), 0.00950, 0.00950 * 0.01);
}

TEST(TurboCodebookTest, LevelsAreSortedAndSymmetric) {
  for (int j = 0; j + 1 < 16; ++j)
    EXPECT_LT(TurboCodebook<4>::Level(j), TurboCodebook<4>::Level(j + 1));
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(TurboCodebook<3>::Level(j), -TurboCodebook<3>::Level(7 - j));
  EXPECT_EQ(TurboMaxLevel<2>(), 1.5104f);
  EXPECT_EQ((TurboBoundary<2, 1>()), 0.0f);
  // The boundaries are the float32 operations the format names.
  EXPECT_EQ((TurboBoundary<3, 2>()),
            (TurboCodebook<3>::Level(2) + TurboCodebook<3>::Level(3)) * 0.5f);
  EXPECT_EQ((TurboBoundary<4, 9>()),
            (TurboCodebook<4>::Level(9) + TurboCodebook<4>::Level(10)) * 0.5f);
  EXPECT_EQ(TurboCode<3>(TurboBoundary<3, 4>()), 5);  // ties go up
  EXPECT_EQ(TurboCode<3>(std::nextafter(TurboBoundary<3, 4>(), 0.0f)), 4);
  EXPECT_EQ(TurboCode<2>(-10.0f), 0);
  EXPECT_EQ(TurboCode<4>(10.0f), 15);
}

// The definition TurboCode searches for: how many boundaries u reaches.
template <int kBits, size_t... kJ>
int BoundariesReached(float u, std::index_sequence<kJ...>) {
  return ((u >= TurboBoundary<kBits, static_cast<int>(kJ)>() ? 1 : 0) + ...);
}

template <int kBits>
void ExpectSearchCountsBoundaries() {
  auto count = [](float u) {
    return BoundariesReached<kBits>(u, std::make_index_sequence<(1 << kBits) - 1>());
  };
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               1e30f,
                               -1e30f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  auto add_around = [&](float t) {
    probes.push_back(t);
    probes.push_back(std::nextafter(t, -INFINITY));
    probes.push_back(std::nextafter(t, INFINITY));
  };
  [&]<size_t... kJ>(std::index_sequence<kJ...>) {
    (add_around(TurboBoundary<kBits, static_cast<int>(kJ)>()), ...);
  }
  (std::make_index_sequence<(1 << kBits) - 1>());
  std::mt19937 rng(kBits);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (int i = 0; i < 20000; ++i) probes.push_back(normal(rng));
  for (float u : probes) {
    EXPECT_EQ(TurboCode<kBits>(u), count(u)) << "bits " << kBits << " u " << u;
    EXPECT_EQ(TurboCodeSelect<kBits>(u), count(u)) << "select, bits " << kBits << " u " << u;
  }
  EXPECT_EQ(TurboCode<kBits>(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(TurboCodeSelect<kBits>(std::numeric_limits<float>::quiet_NaN()), 0);
}

// TurboCodeSelect (the GPU's form of the search) is checked beside TurboCode on the same probes.
TEST(TurboCodebookTest, CodeIsTheNumberOfBoundariesReached) {
  ExpectSearchCountsBoundaries<2>();
  ExpectSearchCountsBoundaries<3>();
  ExpectSearchCountsBoundaries<4>();
}

}  // namespace
}  // namespace kvp
