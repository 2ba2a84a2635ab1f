#include "kvpool/format/turbo_code_cells.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/turbo_quant.h"

namespace kvp {
namespace {

// Floats within `ulps` steps of x on either side (x itself included).
std::vector<float> Around(float x, int ulps) {
  std::vector<float> out = {x};
  float up = x, down = x;
  for (int i = 0; i < ulps; ++i) {
    up = std::nextafter(up, INFINITY);
    down = std::nextafter(down, -INFINITY);
    out.push_back(up);
    out.push_back(down);
  }
  return out;
}

template <int kBits>
void ExpectLookupMatchesTheSearch(float u, const TurboCells<kBits>& cells) {
  const TurboCodeLevel got = TurboLookupCode(cells, u);
  const int code = TurboCode<kBits>(u);
  ASSERT_EQ(got.code, code) << "N=" << kBits << " u=" << u << " (bits 0x" << std::hex
                            << FloatBits(u) << ")";
  ASSERT_EQ(got.level, TurboLevel<kBits>(code)) << "N=" << kBits << " u=" << u;
}

// Every float near each boundary and each cell edge, both zeros, denormals, every 61st float of
// the table's reach (about 35 million), and random values.
template <int kBits>
void ExpectLookupMatchesTheSearchEverywhere() {
  constexpr TurboCells<kBits> cells = MakeTurboCells<kBits>();
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               kTurboCellReach,
                               -kTurboCellReach};
  for (int j = 0; j + 1 < TurboCodebook<kBits>::kLevels; ++j) {
    for (float u : Around(TurboBoundaryAt<kBits>(j), 4096)) probes.push_back(u);
  }
  for (int cell = 0; cell <= kTurboCells; ++cell) {
    const float edge = (cell - kTurboCellOfZero - 0.5f) / kTurboCellsPerUnit;
    if (std::fabs(edge) > kTurboCellReach) continue;
    for (float u : Around(edge, 4096)) probes.push_back(u);
  }
  for (float u : probes) ExpectLookupMatchesTheSearch<kBits>(u, cells);
  for (uint32_t bits = 0; bits <= FloatBits(kTurboCellReach); bits += 61) {
    ExpectLookupMatchesTheSearch<kBits>(BitsToFloat(bits), cells);
    ExpectLookupMatchesTheSearch<kBits>(-BitsToFloat(bits), cells);
  }
  std::mt19937 rng(kBits);
  std::uniform_real_distribution<float> uniform(-kTurboCellReach, kTurboCellReach);
  for (int i = 0; i < 1000000; ++i) ExpectLookupMatchesTheSearch<kBits>(uniform(rng), cells);
}

TEST(TurboCodeCellsTest, LookupGivesTheSearchsCodeAndLevel) {
  ExpectLookupMatchesTheSearchEverywhere<2>();
  ExpectLookupMatchesTheSearchEverywhere<3>();
  ExpectLookupMatchesTheSearchEverywhere<4>();
}

TEST(TurboCodeCellsTest, CellsHoldTheirBoundaries) {
  constexpr TurboCells<3> cells = MakeTurboCells<3>();
  EXPECT_EQ(TurboCellOf(0.0f), static_cast<uint32_t>(kTurboCellOfZero));
  EXPECT_EQ(TurboCellOf(-0.0f), static_cast<uint32_t>(kTurboCellOfZero));
  EXPECT_EQ(TurboCellOf(1.0f / kTurboCellsPerUnit), static_cast<uint32_t>(kTurboCellOfZero + 1));
  // turbo3's middle boundary is 0: values below it in the cell get code 3, the rest 4.
  const TurboCell& middle = cells.cell[kTurboCellOfZero];
  EXPECT_EQ(middle.boundary, 0.0f);
  EXPECT_EQ(middle.code_below, 3);
  EXPECT_EQ(middle.level_below, TurboLevel<3>(3));
  EXPECT_EQ(middle.level_above, TurboLevel<3>(4));
  // The lowest and highest cells hold no boundary.
  EXPECT_EQ(cells.cell[0].boundary, INFINITY);
  EXPECT_EQ(cells.cell[0].code_below, 0);
  EXPECT_EQ(cells.cell[kTurboCells - 1].code_below, 7);
  EXPECT_EQ(cells.cell[kTurboCells - 1].level_above, TurboLevel<3>(7));
}

// The lookup as an encoder policy on the host, failing the test if the encoder hands it a value
// outside its domain.
template <int kBits>
struct CheckedLookup {
  static constexpr bool kFiniteOnly = true;
  TurboCodeLevel operator()(float u) const {
    EXPECT_TRUE(std::isfinite(u) && std::fabs(u) <= kTurboCellReach) << u;
    if (!(std::fabs(u) <= kTurboCellReach)) return {0, 0.0f};
    static constexpr TurboCells<kBits> kCells = MakeTurboCells<kBits>();
    return TurboLookupCode(kCells, u);
  }
};

// Groups that keep every u finite and in reach, and groups that must take the search: NaN,
// infinities, huge values, and denormals so small that alpha overflows.
template <int kBits>
void ExpectEncoderWithLookupWritesTheSameBytes() {
  std::mt19937 rng(11 + kBits);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, kTurboGroupSize - 1);
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 3e38f, -3e38f, 1e-45f, -1e-45f, 0.0f};
  for (int trial = 0; trial < 20000; ++trial) {
    float x[kTurboGroupSize];
    const float scale = std::ldexp(1.0f, trial % 200 - 100);
    for (float& v : x) v = normal(rng) * scale;
    if (trial % 4 == 1) x[pick(rng)] = specials[trial % 9];
    if (trial % 4 == 2) {
      for (float& v : x) v = (trial % 8 == 2) ? 1e-45f * (pick(rng) - 8) : 0.0f;
      x[pick(rng)] = 1e-45f;
    }
    uint8_t want_packed[kTurboGroupBytes<kBits>], got_packed[kTurboGroupBytes<kBits>];
    uint8_t want_scale = 0, got_scale = 0;
    TurboEncodeGroup<kBits>(x, 1.0f, want_packed, &want_scale);
    TurboEncodeGroup<kBits>(x, 1.0f, got_packed, &got_scale, CheckedLookup<kBits>{});
    ASSERT_EQ(0, std::memcmp(want_packed, got_packed, sizeof(want_packed))) << "trial " << trial;
    ASSERT_EQ(want_scale, got_scale) << "trial " << trial;
  }
}

TEST(TurboCodeCellsTest, EncoderWithLookupWritesTheSameBytes) {
  ExpectEncoderWithLookupWritesTheSameBytes<2>();
  ExpectEncoderWithLookupWritesTheSameBytes<3>();
  ExpectEncoderWithLookupWritesTheSameBytes<4>();
}

}  // namespace
}  // namespace kvp
