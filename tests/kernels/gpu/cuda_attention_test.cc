// Paged and sparse decode against the CPU reference, on fresh random inputs each run: within
// stated tolerances, with NaN-filled unused slots and NaN-poisoned outputs, NaN where the
// reference has it, and run-to-run determinism; and the combinations that are not served.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_ops.h"
#include "kernels/paged_decode/paged_decode_ref.h"
#include "kernels/sparse_decode/sparse_decode_ref.h"
#include "tests/kernels/gpu/cuda_test_support.h"
#include "tests/testing/test_pool.h"

namespace kvp {
namespace {

using testing::RandomBf16;
using testing::TestPool;

struct AttentionCase {
  int head_dim, kv_heads, q_heads, block_size;
  KvFormat v_format;
  int window;
  bool rotation = true;
};

// Relative L2 and max-abs error of got vs want, with NaN checks.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel_l2,
                 const std::string& what) {
  double err = 0, ref = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << what << " at " << i;
    if (std::isnan(want[i])) continue;
    err += std::pow(double(got[i]) - want[i], 2);
    ref += double(want[i]) * want[i];
    max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
  }
  EXPECT_LE(std::sqrt(err / ref), rel_l2) << what;
  EXPECT_LE(max_err, 10 * rel_l2 * max_ref) << what;
}

AttentionParams HostAttention(TestPool& pool, const std::vector<Bf16>& q, std::vector<float>& out,
                              int q_heads, float tau) {
  AttentionParams a;
  a.cache = pool.Layer(0);
  a.q = q.data();
  a.block_tables = pool.block_tables().data();
  a.block_table_stride = pool.block_table_stride();
  a.seq_lens = pool.seq_lens().data();
  a.out = out.data();
  a.num_seqs = static_cast<int>(pool.seq_lens().size());
  a.num_q_heads = q_heads;
  a.softmax_scale = DefaultSoftmaxScale(pool.layout().spec().head_dim);
  a.sparse_v_threshold = tau;
  a.max_seq_len = *std::max_element(pool.seq_lens().begin(), pool.seq_lens().end());
  return a;
}

AttentionParams DeviceAttention(const AttentionParams& host, TestPool& pool, DevicePool& dp,
                                const DeviceBuffer& q, const DeviceBuffer& out) {
  AttentionParams a = host;
  a.cache = pool.layout().Layer(dp.arena.get<uint8_t>(), pool.num_blocks(), 0);
  a.q = q.get<Bf16>();
  a.block_tables = dp.tables.get<int32_t>();
  a.seq_lens = dp.lens.get<int32_t>();
  a.out = out.get<float>();
  return a;
}

TEST_F(CudaKernelsTest, PagedDecodeMatchesTheReference) {
  const AttentionCase cases[] = {
      {128, 8, 32, 64, KvFormat::kTurbo3, 0},
      {128, 2, 8, 16, KvFormat::kTurbo4, 0},
      {64, 4, 4, 32, KvFormat::kTurbo2, 0},
      {256, 1, 16, 64, KvFormat::kTurbo3, 0},
      {128, 4, 8, 64, KvFormat::kTurbo3, 300},
      {128, 2, 20, 16, KvFormat::kTurbo2, 0},
      {128, 4, 16, 32, KvFormat::kTurbo4, 0, false},
      {128, 2, 16, 64, KvFormat::kTurbo3, 100},
      {256, 2, 16, 16, KvFormat::kTurbo4, 0},
      {64, 1, 8, 64, KvFormat::kTurbo3, 0},
      // head_dim 64, an even number of kv heads of at most 4 q heads: kv heads paired as one of 128
      // dims (4 q heads each; 3, with an odd number of pairs; 1, without the rotation).
      {64, 8, 32, 64, KvFormat::kTurbo3, 300},
      {64, 6, 18, 16, KvFormat::kTurbo4, 0},
      {64, 2, 2, 32, KvFormat::kTurbo3, 0, false},
      // Several head tiles a kv head: CTAs that decode each chunk once for all of them.
      {64, 1, 64, 16, KvFormat::kTurbo2, 0},
      {256, 1, 64, 32, KvFormat::kTurbo4, 0},
      {128, 2, 40, 64, KvFormat::kTurbo3, 300},
      {128, 1, 128, 64, KvFormat::kTurbo3, 0, false},
  };
  CudaWorkspace ws;
  for (const AttentionCase& c : cases) {
    PoolSpec spec;
    spec.num_kv_heads = c.kv_heads;
    spec.head_dim = c.head_dim;
    spec.block_size = c.block_size;
    spec.v_format = c.v_format;
    spec.v_rotation = c.rotation;
    spec.k_scales = {0.5f};
    spec.v_scales = {0.25f};
    TestPool pool(spec, 3700 / c.block_size + 10);
    pool.FillSequences(rng_, {1, 17, c.block_size * 5, 1000, 2500}, 1.0f, 1.0f);
    const int n = 5;
    const auto q = RandomBf16(rng_, size_t(n) * c.q_heads * c.head_dim, 2.0f);
    std::vector<float> want(q.size(), kNan);
    PagedDecodeParams ref{HostAttention(pool, q, want, c.q_heads, 0.0f), c.window};
    ASSERT_TRUE(PagedDecodeRef(ref).ok());
    DevicePool dp(pool);
    DeviceBuffer dq = Up(q), dout = Up(std::vector<float>(q.size(), kNan));
    PagedDecodeParams dev{DeviceAttention(ref.attn, pool, dp, dq, dout), c.window};
    ASSERT_TRUE(PagedDecodeCuda(dev, ws, nullptr).ok());
    const auto got = Down<float>(dout, q.size());
    ExpectClose(got, want, 3e-3,
                spec.DebugString() + " q_heads " + std::to_string(c.q_heads) + " window " +
                    std::to_string(c.window));
    ASSERT_TRUE(PagedDecodeCuda(dev, ws, nullptr).ok());
    EXPECT_EQ(Down<float>(dout, q.size()), got) << "run to run";
  }
}

// A batch of kv heads large enough to fill the GPU several times over is not split along the
// positions: each CTA is its heads' only part and writes their outputs itself, without the
// combining kernel (4 q heads a kv head, as columns, also of paired kv heads of 64 dims; 128, as
// rows of CTAs decoding once), or leaves one part a head to it (12, as rows: CTAs of four chunks or
// more, which keep the queries in shared memory).
TEST_F(CudaKernelsTest, PagedDecodeOfAWholeGpuBatchMatchesTheReference) {
  struct Case {
    int q_heads, kv_heads, head_dim;
  };
  for (const auto& [q_heads, kv_heads, head_dim] :
       {Case{32, 8, 128}, Case{128, 1, 128}, Case{96, 8, 128}, Case{32, 8, 64}}) {
    PoolSpec spec;  // block 64, turbo3
    spec.num_kv_heads = kv_heads;
    spec.head_dim = head_dim;
    const int n = 320;
    std::vector<int32_t> lens(n);
    std::uniform_int_distribution<int32_t> len(1, 300);
    for (int32_t& l : lens) l = len(rng_);
    TestPool pool(spec, n * 5 + 10);
    pool.FillSequences(rng_, lens);
    const auto q = RandomBf16(rng_, size_t(n) * q_heads * head_dim, 2.0f);
    std::vector<float> want(q.size(), kNan);
    PagedDecodeParams ref{HostAttention(pool, q, want, q_heads, 0.0f), 0};
    ASSERT_TRUE(PagedDecodeRef(ref).ok());
    DevicePool dp(pool);
    DeviceBuffer dq = Up(q), dout = Up(std::vector<float>(q.size(), kNan));
    CudaWorkspace ws;
    PagedDecodeParams dev{DeviceAttention(ref.attn, pool, dp, dq, dout), 0};
    ASSERT_TRUE(PagedDecodeCuda(dev, ws, nullptr).ok());
    ExpectClose(Down<float>(dout, q.size()), want, 3e-3,
                "320 sequences, q_heads " + std::to_string(q_heads) + " head_dim " +
                    std::to_string(head_dim));
  }
}

// Checked for 4 q heads a kv head (heads as columns, also of paired kv heads of 64 dims), 32 and
// 128 (heads as rows of CTAs decoding once: S from ldmatrix and mma, and from wgmma).
TEST_F(CudaKernelsTest, SparseVThresholdStaysWithinItsBound) {
  for (int head_dim : {128, 64}) {
    PoolSpec spec;
    spec.num_kv_heads = 2;
    spec.head_dim = head_dim;
    TestPool pool(spec, 300);
    pool.FillSequences(rng_, {8000, 3000});
    DevicePool dp(pool);
    CudaWorkspace ws;
    for (int q_heads : head_dim == 128 ? std::vector<int>{8, 64, 256} : std::vector<int>{8}) {
      const auto q = RandomBf16(rng_, 2 * q_heads * head_dim, 3.0f);  // peaked attention
      DeviceBuffer dq = Up(q), dense_out = Up(std::vector<float>(q.size(), kNan));
      std::vector<float> host_out(q.size());
      PagedDecodeParams dense{
          DeviceAttention(HostAttention(pool, q, host_out, q_heads, 0.0f), pool, dp, dq, dense_out),
          0};
      ASSERT_TRUE(PagedDecodeCuda(dense, ws, nullptr).ok());
      const auto o = Down<float>(dense_out, q.size());
      for (float tau : {1e-6f, 1e-3f, 1e-2f}) {
        DeviceBuffer out = Up(std::vector<float>(q.size(), kNan));
        PagedDecodeParams sparse = dense;
        sparse.attn.out = out.get<float>();
        sparse.attn.sparse_v_threshold = tau;
        ASSERT_TRUE(PagedDecodeCuda(sparse, ws, nullptr).ok());
        const auto o_tau = Down<float>(out, q.size());
        // ‖o_τ - o‖ <= n · τ · max‖v̂‖ with n the sequence length (every skip is one of them).
        for (int s = 0; s < 2; ++s) {
          for (int h = 0; h < q_heads; ++h) {
            double diff = 0;
            for (int e = 0; e < head_dim; ++e) {
              const size_t i = (size_t(s) * q_heads + h) * head_dim + e;
              diff += std::pow(double(o_tau[i]) - o[i], 2);
            }
            const double max_v_norm = 4.0 * std::sqrt(double(head_dim));  // |v| <= ~4 sigma each
            EXPECT_LE(std::sqrt(diff), pool.seq_lens()[s] * tau * max_v_norm + 1e-3)
                << tau << " q_heads " << q_heads << " head_dim " << head_dim;
          }
        }
      }
    }
  }
}

// Top-k rows for every sequence of `pool`: distinct positions of the sequence in random order,
// at most topk - 100 of them, the rest -1.
std::vector<int32_t> RandomTopkRows(const TestPool& pool, int topk, std::mt19937_64& rng) {
  const int n = static_cast<int>(pool.seq_lens().size());
  std::vector<int32_t> indices(size_t(n) * topk, -1);
  for (int s = 0; s < n; ++s) {
    std::vector<int32_t> all(pool.seq_lens()[s]);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const int take = std::min<int>(all.size(), topk - 100);
    std::copy(all.begin(), all.begin() + take, indices.begin() + s * topk);
    std::shuffle(indices.begin() + s * topk, indices.begin() + (s + 1) * topk, rng);
  }
  return indices;
}

// Four sequences (one of them short) and one sequence are planned with one kv head a CTA; 32
// sequences of 8 kv heads give each CTA enough chunks to cover two.
TEST_F(CudaKernelsTest, SparseDecodeMatchesTheReference) {
  struct Case {
    int q_heads, kv_heads;
    KvFormat v_format;
    std::vector<int32_t> lens;
    int head_dim = 128;
  };
  std::vector<int32_t> many(32);
  std::uniform_int_distribution<int32_t> len(1, 4000);
  for (int32_t& l : many) l = len(rng_);
  // 64/4 heads over 32 sequences: CTAs of eight chunks, queries in shared memory (alone, the
  // first sequence's CTAs take one chunk each and keep them in registers). head_dim 64: kv heads
  // paired as one of 128 dims.
  const Case cases[] = {{32, 8, KvFormat::kTurbo3, {5000, 700, 3000, 64}},
                        {128, 1, KvFormat::kTurbo4, {5000, 700, 3000, 64}},
                        {32, 8, KvFormat::kTurbo3, many},
                        {64, 4, KvFormat::kTurbo2, many},
                        {32, 8, KvFormat::kTurbo3, {5000, 700, 3000, 64}, 64}};
  CudaWorkspace ws;
  for (const Case& c : cases) {
    const std::string what = std::to_string(c.lens.size()) + " sequences, q_heads " +
                             std::to_string(c.q_heads) + " head_dim " + std::to_string(c.head_dim);
    PoolSpec spec;
    spec.num_kv_heads = c.kv_heads;
    spec.head_dim = c.head_dim;
    spec.v_format = c.v_format;
    int64_t blocks = 10;
    for (int32_t l : c.lens) blocks += BlocksForTokens(l, spec.block_size);
    TestPool pool(spec, blocks);
    pool.FillSequences(rng_, c.lens);
    const int n = static_cast<int>(c.lens.size()), topk = 2048;
    const std::vector<int32_t> indices = RandomTopkRows(pool, topk, rng_);
    const auto q = RandomBf16(rng_, size_t(n) * c.q_heads * c.head_dim, 2.0f);
    std::vector<float> want(q.size(), kNan);
    SparseDecodeParams ref{HostAttention(pool, q, want, c.q_heads, 0.0f), indices.data(), topk};
    ASSERT_TRUE(SparseDecodeRef(ref).ok());
    DevicePool dp(pool);
    DeviceBuffer dq = Up(q), dout = Up(std::vector<float>(q.size(), kNan)), di = Up(indices);
    SparseDecodeParams dev{DeviceAttention(ref.attn, pool, dp, dq, dout), di.get<int32_t>(), topk};
    ASSERT_TRUE(SparseDecodeCuda(dev, ws, nullptr).ok());
    ExpectClose(Down<float>(dout, q.size()), want, 3e-3, what);
    // The first sequence alone: a launch too small to fill the GPU, planned differently.
    const size_t heads = size_t(c.q_heads) * c.head_dim;
    DeviceBuffer dout1 = Up(std::vector<float>(heads, kNan));
    SparseDecodeParams one = dev;
    one.attn.num_seqs = 1;
    one.attn.out = dout1.get<float>();
    ASSERT_TRUE(SparseDecodeCuda(one, ws, nullptr).ok());
    ExpectClose(Down<float>(dout1, heads), std::vector<float>(want.begin(), want.begin() + heads),
                3e-3, "the first of " + what);
  }
}

TEST_F(CudaKernelsTest, UnsupportedCombinationsAreNamed) {
  PoolSpec spec;
  spec.k_format = KvFormat::kBf16;
  TestPool pool(spec, 4);
  pool.FillSequences(rng_, {10});
  std::vector<float> out(8 * 128);
  const auto q = RandomBf16(rng_, 8 * 128);
  DevicePool dp(pool);
  DeviceBuffer dq = Up(q), dout = Up(out);
  PagedDecodeParams dev{DeviceAttention(HostAttention(pool, q, out, 8, 0.0f), pool, dp, dq, dout),
                        0};
  CudaWorkspace ws;
  const absl::Status s = PagedDecodeCuda(dev, ws, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("fp8_e4m3"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace kvp
