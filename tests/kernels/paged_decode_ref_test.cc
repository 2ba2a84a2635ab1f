#include "kernels/paged_decode/paged_decode_ref.h"

#include <cmath>
#include <limits>
#include <random>
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

struct Case {
  KvFormat k_format;
  KvFormat v_format;
  bool rotation;
  int head_dim;
  int kv_heads;
  int q_heads;
  int block_size;
};

// One decode over a freshly filled pool; returns outputs, poisoned with NaN before the run.
struct DecodeRun {
  std::vector<Bf16> q;
  std::vector<float> out;
};

DecodeRun RunDecode(TestPool& pool, std::mt19937_64& rng, int q_heads, int window, float tau,
                    float q_std = 1.0f) {
  const PoolSpec& spec = pool.layout().spec();
  const int num_seqs = static_cast<int>(pool.seq_lens().size());
  DecodeRun run;
  run.q = RandomBf16(rng, static_cast<size_t>(num_seqs) * q_heads * spec.head_dim, q_std);
  run.out.assign(run.q.size(), std::numeric_limits<float>::quiet_NaN());
  PagedDecodeParams p;
  p.attn.cache = pool.Layer(0);
  p.attn.q = run.q.data();
  p.attn.block_tables = pool.block_tables().data();
  p.attn.block_table_stride = pool.block_table_stride();
  p.attn.seq_lens = pool.seq_lens().data();
  p.attn.out = run.out.data();
  p.attn.num_seqs = num_seqs;
  p.attn.num_q_heads = q_heads;
  p.attn.softmax_scale = DefaultSoftmaxScale(spec.head_dim);
  p.attn.sparse_v_threshold = tau;
  p.window = window;
  EXPECT_TRUE(PagedDecodeRef(p).ok());
  return run;
}

std::vector<double> SeqOut(const DecodeRun& run, int seq, int q_heads, int d) {
  return std::vector<double>(run.out.begin() + static_cast<size_t>(seq) * q_heads * d,
                             run.out.begin() + static_cast<size_t>(seq + 1) * q_heads * d);
}

TEST(PagedDecodeRefTest, EqualsFp64AttentionOverTheDequantizedCache) {
  const Case cases[] = {
      {KvFormat::kFp8E4m3, KvFormat::kTurbo3, true, 128, 8, 32, 64},
      {KvFormat::kFp8E4m3, KvFormat::kTurbo2, true, 64, 2, 32, 16},
      {KvFormat::kFp8E4m3, KvFormat::kTurbo4, true, 256, 1, 16, 32},
      {KvFormat::kFp8E4m3, KvFormat::kTurbo3, false, 128, 4, 4, 64},
      {KvFormat::kBf16, KvFormat::kBf16, true, 128, 2, 8, 16},
  };
  std::mt19937_64 rng(std::random_device{}());
  for (const Case& c : cases) {
    PoolSpec spec;
    spec.k_format = c.k_format;
    spec.v_format = c.v_format;
    spec.v_rotation = c.rotation;
    spec.head_dim = c.head_dim;
    spec.num_kv_heads = c.kv_heads;
    spec.block_size = c.block_size;
    spec.k_scales = {0.5f};
    spec.v_scales = {0.25f};
    TestPool pool(spec, 40);
    pool.FillSequences(rng, {1, c.block_size, 3 * c.block_size + 5, 257});
    const DecodeRun run = RunDecode(pool, rng, c.q_heads, 0, 0.0f);
    const LayerCache cache = pool.Layer(0);
    for (int s = 0; s < 4; ++s) {
      const int len = pool.seq_lens()[s];
      const auto dense =
          Dequantize(cache, pool.block_tables().data() + s * pool.block_table_stride(), len);
      const auto expected = NaiveAttention(
          dense, run.q.data() + static_cast<size_t>(s) * c.q_heads * c.head_dim, c.q_heads,
          c.kv_heads, c.head_dim, DefaultSoftmaxScale(c.head_dim), [](int) { return true; });
      const auto got = SeqOut(run, s, c.q_heads, c.head_dim);
      for (double x : got) ASSERT_TRUE(std::isfinite(x)) << spec.DebugString();
      EXPECT_LT(RelativeL2(got, expected), 1e-6) << spec.DebugString() << " seq " << s;
    }
  }
}

TEST(PagedDecodeRefTest, SlidingWindowAttendsToTheLastWPositionsOnly) {
  std::mt19937_64 rng(std::random_device{}());
  PoolSpec spec;
  spec.num_kv_heads = 2;
  spec.block_size = 16;
  TestPool pool(spec, 30);
  pool.FillSequences(rng, {100, 7, 64});
  const int window = 20;
  const DecodeRun run = RunDecode(pool, rng, 8, window, 0.0f);
  for (int s = 0; s < 3; ++s) {
    const int len = pool.seq_lens()[s];
    const auto dense =
        Dequantize(pool.Layer(0), pool.block_tables().data() + s * pool.block_table_stride(), len);
    const auto expected =
        NaiveAttention(dense, run.q.data() + static_cast<size_t>(s) * 8 * 128, 8, 2, 128,
                       DefaultSoftmaxScale(128), [&](int p) { return p >= len - window; });
    EXPECT_LT(RelativeL2(SeqOut(run, s, 8, 128), expected), 1e-6) << "seq " << s;
  }
}

TEST(PagedDecodeRefTest, SparseVThresholdStaysWithinItsBoundAndZeroIsDense) {
  std::mt19937_64 rng(std::random_device{}());
  PoolSpec spec;
  spec.num_kv_heads = 2;
  TestPool pool(spec, 80);
  pool.FillSequences(rng, {2048, 1500});
  constexpr int kQHeads = 8, kD = 128;
  const float q_std = 3.0f;  // peaked attention, so many positions fall under τ
  std::mt19937_64 q_rng = rng;
  const DecodeRun dense = RunDecode(pool, rng, kQHeads, 0, 0.0f, q_std);
  int total_skipped = 0;
  for (float tau : {1e-6f, 1e-3f}) {
    std::mt19937_64 same_q = q_rng;
    const DecodeRun sparse = RunDecode(pool, same_q, kQHeads, 0, tau, q_std);
    ASSERT_EQ(sparse.q[5].bits, dense.q[5].bits);
    for (int s = 0; s < 2; ++s) {
      const int len = pool.seq_lens()[s];
      const auto seq = Dequantize(pool.Layer(0),
                                  pool.block_tables().data() + s * pool.block_table_stride(), len);
      double max_v_norm = 0.0;
      for (int p = 0; p < len; ++p) {
        for (int g = 0; g < 2; ++g) {
          double n2 = 0.0;
          for (int e = 0; e < kD; ++e)
            n2 += std::pow(seq.v[(static_cast<size_t>(p) * 2 + g) * kD + e], 2);
          max_v_norm = std::max(max_v_norm, std::sqrt(n2));
        }
      }
      for (int qh = 0; qh < kQHeads; ++qh) {
        // Positions under τ by the final max (what the reference skips).
        const Bf16* q = dense.q.data() + (static_cast<size_t>(s) * kQHeads + qh) * kD;
        std::vector<double> logits(len);
        double m = -INFINITY;
        for (int p = 0; p < len; ++p) {
          double dot = 0.0;
          for (int e = 0; e < kD; ++e)
            dot +=
                double{Bf16ToFloat(q[e])} * seq.k[(static_cast<size_t>(p) * 2 + qh / 4) * kD + e];
          logits[p] = dot * DefaultSoftmaxScale(kD);
          m = std::max(m, logits[p]);
        }
        int skipped = 0;
        for (int p = 0; p < len; ++p) skipped += std::exp(logits[p] - m) <= tau * (1 + 1e-6);
        total_skipped += skipped;
        double diff2 = 0.0;
        for (int e = 0; e < kD; ++e) {
          const size_t i = (static_cast<size_t>(s) * kQHeads + qh) * kD + e;
          diff2 += std::pow(double{sparse.out[i]} - dense.out[i], 2);
        }
        EXPECT_LE(std::sqrt(diff2), skipped * tau * max_v_norm + 1e-6)
            << "tau " << tau << " seq " << s << " head " << qh;
      }
      // And exactly the positions under τ were skipped.
      const auto expected = NaiveAttention(
          seq, dense.q.data() + static_cast<size_t>(s) * kQHeads * kD, kQHeads, 2, kD,
          DefaultSoftmaxScale(kD), [](int) { return true; }, tau);
      const std::vector<double> got(sparse.out.begin() + static_cast<size_t>(s) * kQHeads * kD,
                                    sparse.out.begin() + static_cast<size_t>(s + 1) * kQHeads * kD);
      EXPECT_LT(RelativeL2(got, expected), 1e-6) << "tau " << tau << " seq " << s;
    }
  }
  EXPECT_GT(total_skipped, 1000);  // the threshold was exercised
}

TEST(PagedDecodeRefTest, RejectsBadShapesAndBlocks) {
  std::mt19937_64 rng(1);
  PoolSpec spec;
  spec.num_kv_heads = 4;
  TestPool pool(spec, 4);
  pool.FillSequences(rng, {70});
  std::vector<Bf16> q = RandomBf16(rng, 6 * 128);
  std::vector<float> out(q.size());
  PagedDecodeParams p;
  p.attn.cache = pool.Layer(0);
  p.attn.q = q.data();
  p.attn.block_tables = pool.block_tables().data();
  p.attn.block_table_stride = pool.block_table_stride();
  p.attn.seq_lens = pool.seq_lens().data();
  p.attn.out = out.data();
  p.attn.num_seqs = 1;
  p.attn.num_q_heads = 6;  // not a multiple of 4 kv heads
  p.attn.softmax_scale = 0.1f;
  EXPECT_EQ(PagedDecodeRef(p).code(), absl::StatusCode::kInvalidArgument);
  p.attn.num_q_heads = 4;
  p.attn.sparse_v_threshold = -1.0f;
  EXPECT_EQ(PagedDecodeRef(p).code(), absl::StatusCode::kInvalidArgument);
  p.attn.sparse_v_threshold = 0.0f;
  std::vector<int32_t> bad_table = {pool.block_tables()[0], 99};
  p.attn.block_tables = bad_table.data();
  EXPECT_EQ(PagedDecodeRef(p).code(), absl::StatusCode::kOutOfRange);
  const int32_t too_long = 1000;
  p.attn.block_tables = pool.block_tables().data();
  p.attn.seq_lens = &too_long;
  EXPECT_EQ(PagedDecodeRef(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
