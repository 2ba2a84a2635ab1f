#include "kernels/sparse_decode/sparse_decode_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/naive_attention.h"
#include "tests/testing/test_pool.h"

namespace kvp {
namespace {

using testing::Dequantize;
using testing::NaiveAttention;
using testing::RandomBf16;
using testing::RelativeL2;
using testing::TestPool;

struct SparseFixture {
  TestPool pool;
  std::vector<Bf16> q;
  std::vector<int32_t> indices;
  std::vector<float> out;
  SparseDecodeParams params;

  SparseFixture(const PoolSpec& spec, std::mt19937_64& rng, const std::vector<int32_t>& lens,
                int q_heads, int topk)
      : pool(spec, 80) {
    pool.FillSequences(rng, lens);
    const int n = static_cast<int>(lens.size());
    q = RandomBf16(rng, static_cast<size_t>(n) * q_heads * spec.head_dim, 2.0f);
    out.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
    indices.assign(static_cast<size_t>(n) * topk, -1);
    for (int s = 0; s < n; ++s) {
      // A random subset (possibly short) in random order, -1 sprinkled between.
      std::vector<int32_t> all(lens[s]);
      for (int32_t i = 0; i < lens[s]; ++i) all[i] = i;
      std::shuffle(all.begin(), all.end(), rng);
      const int take = std::min<int>(lens[s], topk - topk / 4);
      for (int i = 0; i < take; ++i) indices[static_cast<size_t>(s) * topk + i] = all[i];
      std::shuffle(indices.begin() + static_cast<size_t>(s) * topk,
                   indices.begin() + static_cast<size_t>(s + 1) * topk, rng);
    }
    params.attn.cache = pool.Layer(0);
    params.attn.q = q.data();
    params.attn.block_tables = pool.block_tables().data();
    params.attn.block_table_stride = pool.block_table_stride();
    params.attn.seq_lens = pool.seq_lens().data();
    params.attn.out = out.data();
    params.attn.num_seqs = n;
    params.attn.num_q_heads = q_heads;
    params.attn.softmax_scale = DefaultSoftmaxScale(spec.head_dim);
    params.indices = indices.data();
    params.topk = topk;
  }
};

TEST(SparseDecodeRefTest, EqualsDenseAttentionMaskedToTheSelectedPositions) {
  std::mt19937_64 rng(std::random_device{}());
  for (int q_heads : {8, 64}) {
    PoolSpec spec;
    spec.num_kv_heads = q_heads == 64 ? 1 : 8;
    spec.v_format = q_heads == 64 ? KvFormat::kTurbo4 : KvFormat::kTurbo2;
    SparseFixture f(spec, rng, {2000, 100, 1}, q_heads, 256);
    ASSERT_TRUE(SparseDecodeRef(f.params).ok());
    for (int s = 0; s < 3; ++s) {
      const int len = f.pool.seq_lens()[s];
      std::set<int> selected(f.indices.begin() + s * 256, f.indices.begin() + (s + 1) * 256);
      const auto dense = Dequantize(
          f.pool.Layer(0), f.pool.block_tables().data() + s * f.pool.block_table_stride(), len);
      const auto expected = NaiveAttention(
          dense, f.q.data() + static_cast<size_t>(s) * q_heads * 128, q_heads, spec.num_kv_heads,
          128, DefaultSoftmaxScale(128), [&](int p) { return selected.count(p) > 0; });
      const std::vector<double> got(f.out.begin() + static_cast<size_t>(s) * q_heads * 128,
                                    f.out.begin() + static_cast<size_t>(s + 1) * q_heads * 128);
      for (double x : got) ASSERT_TRUE(std::isfinite(x));
      EXPECT_LT(RelativeL2(got, expected), 1e-6) << "seq " << s << " q_heads " << q_heads;
    }
  }
}

TEST(SparseDecodeRefTest, ARowWithNoSelectionGivesZeros) {
  std::mt19937_64 rng(3);
  SparseFixture f(PoolSpec(), rng, {50}, 8, 16);
  std::fill(f.indices.begin(), f.indices.end(), -1);
  ASSERT_TRUE(SparseDecodeRef(f.params).ok());
  for (float x : f.out) EXPECT_EQ(x, 0.0f);
}

TEST(SparseDecodeRefTest, RejectsIndicesOutsideTheSequenceAndRepeats) {
  std::mt19937_64 rng(4);
  SparseFixture f(PoolSpec(), rng, {50}, 8, 16);
  f.indices.assign(16, -1);
  f.indices[3] = 50;
  EXPECT_EQ(SparseDecodeRef(f.params).code(), absl::StatusCode::kOutOfRange);
  f.indices[3] = -2;
  EXPECT_EQ(SparseDecodeRef(f.params).code(), absl::StatusCode::kOutOfRange);
  f.indices[3] = 7;
  f.indices[9] = 7;
  EXPECT_EQ(SparseDecodeRef(f.params).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
