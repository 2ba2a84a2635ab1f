#include "kernels/indexer_logits/indexer_logits_ref.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_pool.h"

namespace kvp {
namespace {

using testing::RandomBf16;
using testing::TestPool;

TEST(IndexerLogitsRefTest, WeightedReluOfDotProductsWithMinusInfinityPastTheEnd) {
  std::mt19937_64 rng(std::random_device{}());
  PoolSpec spec;
  spec.indexer = true;
  spec.num_kv_heads = 1;
  TestPool pool(spec, 30);
  const std::vector<int32_t> lens = {700, 1, 129};
  pool.FillSequences(rng, lens);
  const int n = 3, stride = 768;
  std::vector<Bf16> q = RandomBf16(rng, size_t{n} * kIndexHeads * kIndexHeadDim);
  std::vector<float> w(n * kIndexHeads);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : w) x = uniform(rng);
  std::vector<float> logits(n * stride, std::numeric_limits<float>::quiet_NaN());
  IndexerLogitsParams p;
  p.cache = pool.Layer(0);
  p.index_q = q.data();
  p.head_weights = w.data();
  p.block_tables = pool.block_tables().data();
  p.block_table_stride = pool.block_table_stride();
  p.seq_lens = pool.seq_lens().data();
  p.logits = logits.data();
  p.logits_stride = stride;
  p.num_seqs = n;
  ASSERT_TRUE(IndexerLogitsRef(p).ok());

  const LayerCache c = pool.Layer(0);
  for (int s = 0; s < n; ++s) {
    for (int t = 0; t < stride; ++t) {
      const float got = logits[s * stride + t];
      if (t >= lens[s]) {
        EXPECT_EQ(got, -std::numeric_limits<float>::infinity());
        continue;
      }
      // Dequantize straight from the section bytes: E4M3 values times the float32 scale.
      const int32_t block = pool.block_tables()[s * pool.block_table_stride() + t / 64];
      const uint8_t* values = c.Block(block) + c.sections.index_values + (t % 64) * 128;
      float scale;
      std::memcpy(&scale, c.Block(block) + c.sections.index_scales + (t % 64) * 4, 4);
      double expected = 0.0;
      for (int h = 0; h < kIndexHeads; ++h) {
        double dot = 0.0;
        for (int i = 0; i < kIndexHeadDim; ++i) {
          dot += double{Bf16ToFloat(q[(s * kIndexHeads + h) * kIndexHeadDim + i])} *
                 (double{E4m3ToFloat(values[i])} * scale);
        }
        expected += w[s * kIndexHeads + h] * std::max(dot, 0.0);
      }
      EXPECT_NEAR(got, expected, 1e-5 * (1.0 + std::fabs(expected))) << s << " " << t;
    }
  }
}

TEST(IndexerLogitsRefTest, NeedsAPoolWithAnIndexer) {
  std::mt19937_64 rng(1);
  TestPool pool(PoolSpec(), 4);
  pool.FillSequences(rng, {10});
  std::vector<Bf16> q(kIndexHeads * kIndexHeadDim);
  std::vector<float> w(kIndexHeads), logits(64);
  IndexerLogitsParams p;
  p.cache = pool.Layer(0);
  p.index_q = q.data();
  p.head_weights = w.data();
  p.block_tables = pool.block_tables().data();
  p.block_table_stride = 1;
  p.seq_lens = pool.seq_lens().data();
  p.logits = logits.data();
  p.logits_stride = 64;
  p.num_seqs = 1;
  EXPECT_EQ(IndexerLogitsRef(p).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvp
