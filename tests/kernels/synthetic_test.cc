#include "kernels/synthetic/synthetic.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/format/indexer_quant.h"

namespace kvp {
namespace {

TEST(SyntheticTest, NormalHasUnitMomentsAndBoundedTails) {
  double sum = 0, sum2 = 0, max_abs = 0;
  constexpr int kN = 200000;
  for (int i = 0; i < kN; ++i) {
    const float x = SyntheticNormal(SyntheticHash(42, 0, SyntheticStream::kValue, i, 0));
    sum += x;
    sum2 += double{x} * x;
    max_abs = std::max(max_abs, std::fabs(double{x}));
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.01);
  EXPECT_NEAR(sum2 / kN, 1.0, 0.02);
  EXPECT_LE(max_abs, std::sqrt(12.0) / 2 * 2.0001);  // Irwin-Hall of 4 spans ±√12 / 2 · 2
}

TEST(SyntheticTest, ValuesArePinnedBitForBit) {
  // The GPU generator must reproduce these; a change here is a change of the synthetic model.
  EXPECT_EQ(SyntheticHash(1, 2, SyntheticStream::kKey, 3, 4),
            SyntheticHash(1, 2, SyntheticStream::kKey, 3, 4));
  const uint64_t h = SyntheticHash(0x6B76706F6F6Cull, 0, SyntheticStream::kKey, 0, 0);
  const int32_t sum = static_cast<int32_t>(h & 0xFFFF) + static_cast<int32_t>((h >> 16) & 0xFFFF) +
                      static_cast<int32_t>((h >> 32) & 0xFFFF) + static_cast<int32_t>(h >> 48);
  EXPECT_EQ(SyntheticNormal(h), static_cast<float>(sum - 131070) * 2.6428898e-05f);
  EXPECT_NE(SyntheticHash(1, 2, SyntheticStream::kKey, 3, 4),
            SyntheticHash(1, 2, SyntheticStream::kKey, 3, 5));
  EXPECT_NE(SyntheticHash(1, 2, SyntheticStream::kKey, 3, 4),
            SyntheticHash(1, 2, SyntheticStream::kValue, 3, 4));
  EXPECT_NE(SyntheticHash(1, 2, SyntheticStream::kKey, 3, 4),
            SyntheticHash(1, 3, SyntheticStream::kKey, 3, 4));
}

TEST(SyntheticTest, EqualTokensGiveEqualActivationsAndOthersDiffer) {
  SyntheticConfig cfg;
  SyntheticShape shape{2, 4, 64};
  const std::vector<int32_t> a = {11, 12, 13}, b = {11, 12, 99};
  std::vector<Bf16> ka(3 * 128), va(3 * 128), kb(3 * 128), vb(3 * 128);
  std::vector<Bf16> ia(3 * 128), ib(3 * 128);
  FillSyntheticTokens(cfg, shape, 0, a, 0, ka.data(), va.data(), ia.data());
  FillSyntheticTokens(cfg, shape, 0, b, 0, kb.data(), vb.data(), ib.data());
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(ka[i].bits, kb[i].bits);
    EXPECT_EQ(va[i].bits, vb[i].bits);
  }
  int differ = 0;
  for (int i = 256; i < 384; ++i) differ += ka[i].bits != kb[i].bits;
  EXPECT_GT(differ, 100);
}

TEST(SyntheticTest, OutlierChannelsAreLarger) {
  SyntheticConfig cfg;
  int outliers = 0;
  for (uint32_t ch = 0; ch < 128; ++ch) outliers += KeyChannelGain(cfg, 0, ch) > 1.0f;
  EXPECT_GT(outliers, 2);
  EXPECT_LT(outliers, 20);
  cfg.outlier_period = 0;
  for (uint32_t ch = 0; ch < 128; ++ch) EXPECT_EQ(KeyChannelGain(cfg, 0, ch), 1.0f);
}

TEST(SyntheticTest, NeedleQueriesPointAtTheirKey) {
  SyntheticConfig cfg;
  SyntheticShape shape{1, 2, 128};
  std::vector<int32_t> tokens(500);
  for (int i = 0; i < 500; ++i) tokens[i] = i * 7 + 1;
  std::vector<Bf16> k(500 * 128), v(500 * 128), ik(500 * 128);
  FillSyntheticTokens(cfg, shape, 3, tokens, 0, k.data(), v.data(), ik.data());
  const SyntheticNeedle needle{321, tokens[321], 1.0f};
  std::vector<Bf16> q(2 * 128), iq(kIndexHeads * kIndexHeadDim);
  std::vector<float> w(kIndexHeads);
  FillSyntheticQuery(cfg, shape, 3, 77, &needle, q.data());
  FillSyntheticIndexQuery(cfg, 3, 77, &needle, iq.data(), w.data());
  auto argmax = [&](const Bf16* query, const std::vector<Bf16>& keys) {
    int best = 0;
    double best_dot = -1e30;
    for (int p = 0; p < 500; ++p) {
      double dot = 0;
      for (int e = 0; e < 128; ++e) dot += Bf16ToFloat(query[e]) * Bf16ToFloat(keys[p * 128 + e]);
      if (dot > best_dot) best_dot = dot, best = p;
    }
    return best;
  };
  EXPECT_EQ(argmax(q.data(), k), 321);
  EXPECT_EQ(argmax(q.data() + 128, k), 321);
  EXPECT_EQ(argmax(iq.data(), ik), 321);
  for (float x : w) {
    EXPECT_GE(x, 0.5f / 8);
    EXPECT_LT(x, 1.5f / 8);
  }
}

}  // namespace
}  // namespace kvp
