// The CUDA kernels other than attention (cuda_attention_test.cc) against their CPU references, on
// fresh random inputs each run: writes bit for bit (values, scales and untouched bytes), indexer
// logits within a stated bound, top-k element for element, and run-to-run determinism.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_copy/block_copy_ref.h"
#include "kernels/cache_write/cache_write_ref.h"
#include "kernels/cuda_ops.h"
#include "kernels/indexer_logits/indexer_logits_ref.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kernels/topk/topk_launch.h"
#include "kernels/topk/topk_ref.h"
#include "tests/kernels/gpu/cuda_test_support.h"
#include "tests/testing/test_pool.h"

namespace kvp {
namespace {

using testing::RandomBf16;
using testing::TestPool;
using testing::TieAtTheKth;

std::vector<uint16_t> Bits(const std::vector<Bf16>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = x[i].bits;
  return b;
}

// --- cache write -------------------------------------------------------------------------------

// One cache write's inputs, on the host for the reference and uploaded for the kernel.
struct CacheWriteInputs {
  CacheWriteInputs(std::vector<Bf16> k_in, std::vector<Bf16> v_in, std::vector<Bf16> index_k_in,
                   std::vector<int64_t> slots_in)
      : k(std::move(k_in)),
        v(std::move(v_in)),
        index_k(std::move(index_k_in)),
        slots(std::move(slots_in)),
        dk(Up(k)),
        dv(Up(v)),
        dindex_k(Up(index_k)),
        dslots(Up(slots)) {}
  CacheWriteParams Host(const LayerCache& c) const {
    return {c, k.data(), v.data(), index_k.data(), slots.data(), int64_t(slots.size())};
  }
  CacheWriteParams Device(const LayerCache& c) const {
    return {c,
            dk.get<Bf16>(),
            dv.get<Bf16>(),
            dindex_k.get<Bf16>(),
            dslots.get<int64_t>(),
            int64_t(slots.size())};
  }
  std::vector<Bf16> k, v, index_k;
  std::vector<int64_t> slots;
  DeviceBuffer dk, dv, dindex_k, dslots;
};

// Writes every layer of the pool with the reference into `host` and with the kernel into `arena`,
// then returns the kernel's bytes.
std::vector<uint8_t> WriteEveryLayer(const BlockLayout& layout, int64_t blocks,
                                     const CacheWriteInputs& in, std::vector<uint8_t>& host,
                                     DeviceBuffer& arena) {
  for (int layer = 0; layer < layout.spec().num_layers; ++layer) {
    EXPECT_TRUE(CacheWriteRef(in.Host(layout.Layer(host.data(), blocks, layer))).ok());
    EXPECT_TRUE(
        CacheWriteCuda(in.Device(layout.Layer(arena.get<uint8_t>(), blocks, layer)), nullptr).ok());
  }
  return Down<uint8_t>(arena, host.size());
}

// How many bytes of `got` differ from `want`, and the first of them.
std::pair<size_t, size_t> Differences(const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
  size_t count = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && count++ == 0) first = i;
  }
  return {count, first};
}

TEST_F(CudaKernelsTest, CacheWriteIsBitIdenticalToTheReference) {
  for (KvFormat v : {KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4, KvFormat::kBf16}) {
    for (int d : {64, 128, 256}) {
      for (KvFormat k : {KvFormat::kFp8E4m3, KvFormat::kBf16}) {
        PoolSpec spec;
        spec.num_layers = 2;
        spec.num_kv_heads = 3;
        spec.head_dim = d;
        spec.block_size = 16;
        spec.k_format = k;
        spec.v_format = v;
        spec.indexer = true;
        spec.indexer_ue8m0 = d != 64;
        spec.v_rotation = d != 256 || v != KvFormat::kTurbo4;
        spec.k_scales = {1.0f, 0.37f};
        spec.v_scales = {1.0f, 0.05f};
        const BlockLayout layout = BlockLayout::Create(spec).value();
        const int64_t blocks = 12;
        const int tokens = 150;
        std::vector<uint8_t> host(blocks * layout.block_stride(), 0xFF);
        DeviceBuffer arena = Up(host);
        std::vector<int64_t> slots(tokens);
        std::vector<int64_t> all(blocks * 16);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng_);
        for (int t = 0; t < tokens; ++t) slots[t] = t % 11 == 5 ? -1 : all[t];
        auto kk = RandomBf16(rng_, size_t(tokens) * 3 * d, 3.0f);
        auto vv = RandomBf16(rng_, size_t(tokens) * 3 * d, 0.02f);
        auto ik = RandomBf16(rng_, size_t(tokens) * 128, 0.5f);
        ik[7] = Bf16FromFloat(0.0f);
        // Values at the edges of E4M3: NaN of both signs, infinities, saturation, subnormals.
        const float specials[] = {kNan,  -kNan,  INFINITY, -INFINITY, 1e6f,   -449.0f,
                                  1e-3f, -3e-3f, 0.0f,     -0.0f,     464.0f, 0.0009765625f};
        for (size_t i = 0; i < std::size(specials); ++i) {
          kk[5 * i + 1] = Bf16FromFloat(specials[i]);
          vv[7 * i + 3] = Bf16FromFloat(specials[i]);
          ik[3 * i + 200] = Bf16FromFloat(specials[i]);
        }
        const CacheWriteInputs in(std::move(kk), std::move(vv), std::move(ik), std::move(slots));
        const std::vector<uint8_t> got = WriteEveryLayer(layout, blocks, in, host, arena);
        const auto [mismatches, first] = Differences(got, host);
        EXPECT_EQ(mismatches, 0u) << spec.DebugString() << " first at byte " << first;
        // Run to run: writing again gives the same bytes.
        ASSERT_TRUE(
            CacheWriteCuda(in.Device(layout.Layer(arena.get<uint8_t>(), blocks, 1)), nullptr).ok());
        EXPECT_EQ(Down<uint8_t>(arena, host.size()), got);
      }
    }
  }
}

TEST_F(CudaKernelsTest, LargeCacheWriteIsBitIdenticalToTheReference) {
  // Enough tokens that the kernel gives each thread two groups of a head (more than one wave of
  // CTAs), for every format and head dim, and a count that leaves part of the last CTA's items
  // past the end.
  for (KvFormat v : {KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4, KvFormat::kBf16}) {
    for (int d : {64, 128, 256}) {
      PoolSpec spec;
      spec.num_layers = 1;
      spec.num_kv_heads = 8;
      spec.head_dim = d;
      spec.block_size = 64;
      spec.k_format = d == 256 ? KvFormat::kBf16 : KvFormat::kFp8E4m3;
      spec.v_format = v;
      spec.v_rotation = d != 64 || v != KvFormat::kTurbo2;
      spec.k_scales = {d == 64 ? 0.37f : 1.0f};
      spec.v_scales = {d == 128 ? 1.0f : 0.05f};
      spec.indexer = true;
      const BlockLayout layout = BlockLayout::Create(spec).value();
      const int tokens = 9001;
      const int64_t blocks = (tokens + 63) / 64 + 4;
      std::vector<uint8_t> host(blocks * layout.block_stride(), 0xFF);
      DeviceBuffer arena = Up(host);
      std::vector<int64_t> all(blocks * 64);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng_);
      std::vector<int64_t> slots(all.begin(), all.begin() + tokens);
      for (int t = 0; t < tokens; t += 97) slots[t] = -1;
      const CacheWriteInputs in(RandomBf16(rng_, size_t(tokens) * 8 * d, 2.0f),
                                RandomBf16(rng_, size_t(tokens) * 8 * d, 0.5f),
                                RandomBf16(rng_, size_t(tokens) * 128, 1.0f), std::move(slots));
      const std::vector<uint8_t> got = WriteEveryLayer(layout, blocks, in, host, arena);
      const auto [mismatches, first] = Differences(got, host);
      EXPECT_EQ(mismatches, 0u) << spec.DebugString() << " first at byte " << first;
    }
  }
}

TEST_F(CudaKernelsTest, CacheWriteEncodesEveryBf16ValueLikeTheReference) {
  // All 65,536 bf16 bit patterns (both zeros, every subnormal-range tie of E4M3, infinities, quiet
  // and signalling NaN of both signs) as K, V and index K, in a fresh order each run, with K scales
  // 1 and 0.37, V rotated (which spreads a NaN over its head) and not.
  for (bool rotation : {true, false}) {
    PoolSpec spec;
    spec.num_layers = 2;
    spec.num_kv_heads = 1;
    spec.head_dim = 128;
    spec.block_size = 16;
    spec.v_format = KvFormat::kTurbo3;
    spec.v_rotation = rotation;
    spec.indexer = true;
    spec.k_scales = {1.0f, 0.37f};
    const BlockLayout layout = BlockLayout::Create(spec).value();
    const int tokens = 65536 / 128;
    const int64_t blocks = tokens / spec.block_size;
    std::vector<Bf16> every(65536);
    for (size_t i = 0; i < every.size(); ++i) every[i].bits = static_cast<uint16_t>(i);
    std::shuffle(every.begin(), every.end(), rng_);
    std::vector<int64_t> slots(tokens);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    std::vector<uint8_t> host(blocks * layout.block_stride(), 0xFF);
    DeviceBuffer arena = Up(host);
    const CacheWriteInputs in(every, every, every, std::move(slots));
    const std::vector<uint8_t> got = WriteEveryLayer(layout, blocks, in, host, arena);
    const auto [mismatches, first] = Differences(got, host);
    EXPECT_EQ(mismatches, 0u) << "rotation " << rotation << ", first at byte " << first << ": got "
                              << int{got[first]} << ", reference " << int{host[first]};
  }
}

// --- indexer and top-k -------------------------------------------------------------------------

// Every pool block size: a 64-position chunk of the kernel is one, two or four whole blocks. The
// kernel multiplies keys by queries split into two E4M3 parts on FP8 tensor cores, whose sums keep
// about 13 bits (kernels/common/e4m3_split.h): a few 1e-4 of the row's largest logit against the
// float64 reference; a part left out or a misplaced dim would be off by percents. Heads of very
// different magnitudes check each head's own scale (f16 queries overflowed at 65,504).
TEST_F(CudaKernelsTest, IndexerLogitsMatchTheReference) {
  for (const int block_size : {64, 32, 16}) {
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    PoolSpec spec;
    spec.num_kv_heads = 1;
    spec.indexer = true;
    spec.block_size = block_size;
    TestPool pool(spec, 200 * (64 / block_size));
    pool.FillSequences(rng_, {5000, 1, 130, 4096});
    const int n = 4, stride = 5101;  // not a whole number of 64-position chunks
    auto q = RandomBf16(rng_, size_t(n) * kIndexHeads * kIndexHeadDim);
    auto scale_heads = [&](int seq, int first, int count, float by) {
      for (int i = 0; i < count * kIndexHeadDim; ++i) {
        Bf16& x = q[(size_t(seq) * kIndexHeads + first) * kIndexHeadDim + i];
        x = Bf16FromFloat(Bf16ToFloat(x) * by);
      }
    };
    scale_heads(0, 1, 1, 1e6f);              // past f16's range
    scale_heads(0, 2, 1, 1e-6f);             // beside a head 10^12 larger
    scale_heads(3, 0, kIndexHeads, 1e-12f);  // a whole sequence below f16's range
    std::vector<float> w(n * kIndexHeads);
    std::uniform_real_distribution<float> uni(-0.2f, 1.0f);
    for (float& x : w) x = uni(rng_);
    std::vector<float> want(n * stride, kNan);
    IndexerLogitsParams ref{pool.Layer(0),
                            q.data(),
                            w.data(),
                            pool.block_tables().data(),
                            pool.block_table_stride(),
                            pool.seq_lens().data(),
                            want.data(),
                            stride,
                            n,
                            kIndexHeads};
    ASSERT_TRUE(IndexerLogitsRef(ref).ok());
    DevicePool dp(pool);
    DeviceBuffer dq = Up(q), dw = Up(w), dout = Up(std::vector<float>(want.size(), kNan));
    IndexerLogitsParams dev = ref;
    dev.cache = pool.layout().Layer(dp.arena.get<uint8_t>(), pool.num_blocks(), 0);
    dev.index_q = dq.get<Bf16>();
    dev.head_weights = dw.get<float>();
    dev.block_tables = dp.tables.get<int32_t>();
    dev.seq_lens = dp.lens.get<int32_t>();
    dev.logits = dout.get<float>();
    ASSERT_TRUE(IndexerLogitsCuda(dev, nullptr).ok());
    const auto got = Down<float>(dout, want.size());
    for (int s = 0; s < n; ++s) {  // errors relative to the row's largest logit
      double row_max = 0, max_err = 0;
      for (int i = s * stride; i < (s + 1) * stride; ++i) {
        if (std::isinf(want[i])) {
          ASSERT_EQ(got[i], want[i]) << i;
          continue;
        }
        row_max = std::max(row_max, std::fabs(double(want[i])));
        max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
      }
      EXPECT_LE(max_err, 1e-3 * row_max) << "sequence " << s;
    }
    ASSERT_TRUE(IndexerLogitsCuda(dev, nullptr).ok());
    EXPECT_EQ(Down<float>(dout, want.size()), got) << "run to run";
  }
}

// `ws` is shared by the calls of a test: top-k's counters must be left zero by every launch, or the
// next call (another shape) goes wrong.
void ExpectTopkEqualsReference(const std::vector<float>& scores, const std::vector<int32_t>& lens,
                               int stride, int k, const std::string& what, CudaWorkspace& ws) {
  const int rows = static_cast<int>(lens.size());
  std::vector<int32_t> want(size_t(rows) * k, -7);
  TopkParams ref{scores.data(), lens.data(), want.data(), stride, rows, k};
  ASSERT_TRUE(TopkRef(ref).ok());
  DeviceBuffer ds = Up(scores), dl = Up(lens), di = Up(std::vector<int32_t>(want.size(), -7));
  TopkParams dev{ds.get<float>(), dl.get<int32_t>(), di.get<int32_t>(), stride, rows, k};
  ASSERT_TRUE(TopkCuda(dev, ws, nullptr).ok());
  const auto got = Down<int32_t>(di, want.size());
  EXPECT_EQ(got, want) << what;
  ASSERT_TRUE(TopkCuda(dev, ws, nullptr).ok());
  EXPECT_EQ(Down<int32_t>(di, want.size()), got) << what << " run to run";
}

TEST_F(CudaKernelsTest, TopkEqualsTheReferenceElementForElement) {
  std::normal_distribution<float> normal;
  CudaWorkspace ws;
  for (int k : {1, 256, 2048}) {
    const int stride = 163840;
    std::vector<float> scores(stride);
    for (float& x : scores) x = normal(rng_);
    ExpectTopkEqualsReference(scores, {stride}, stride, k, "random k=" + std::to_string(k), ws);
  }
  // Batches with rows of different lengths, ties, -inf, NaN, short rows.
  const int rows = 12, stride = 20000;
  std::vector<float> scores(size_t(rows) * stride);
  std::vector<int32_t> lens(rows);
  std::uniform_int_distribution<int> few(0, 5);
  for (int r = 0; r < rows; ++r) {
    lens[r] = r == 0   ? 0
              : r == 1 ? 100
              : r == 2 ? 2048
                       : std::uniform_int_distribution<int>(2049, stride)(rng_);
    for (int i = 0; i < stride; ++i) {
      float& x = scores[size_t(r) * stride + i];
      switch (r % 4) {
        case 0:
          x = static_cast<float>(few(rng_));
          break;  // ties
        case 1:
          x = -std::numeric_limits<float>::infinity();
          break;  // -inf row
        case 2:
          x = i % 3 == 0 ? kNan : normal(rng_);
          break;  // NaN
        default:
          x = i % 2 ? 0.0f : -0.0f;  // signed zeros
      }
    }
  }
  ExpectTopkEqualsReference(scores, lens, stride, 2048, "mixed rows", ws);
  ExpectTopkEqualsReference(scores, lens, stride, 64, "mixed rows k=64", ws);
  // Rows not 16-byte aligned (odd stride): the scalar loads.
  const int odd = stride - 3;
  ExpectTopkEqualsReference(std::vector<float>(scores.begin(), scores.begin() + 4 * odd),
                            {odd, odd - 1, 2047, odd - 5000}, odd, 2048, "odd stride", ws);
}

// The three ways the search decides a row (what the bench reports next to each top-k time), each
// giving the reference's result: scores whose top 24 key bits all differ, in two passes; a tie at
// the k-th, from the second pass's candidate lists; 3,000 scores equal to the k-th, too many to
// read from the lists, in a third pass.
TEST_F(CudaKernelsTest, TopkDecidesARowInTwoPassesFromTheListOrInAThird) {
  const int n = 163840, k = 2048;
  const std::vector<int32_t> lens = {n};
  CudaWorkspace ws;
  // 1.0 and up, 256 ulps apart, shuffled; those ranked [first, last) in ascending order made equal
  // to the k-th largest (ranked n - k).
  auto spaced = [&](int first, int last) {
    std::vector<float> scores(n);
    for (int i = 0; i < n; ++i) {
      const int rank = i >= first && i < last ? n - k : i;
      const uint32_t bits = 0x3F800000u + (static_cast<uint32_t>(rank) << 8);
      std::memcpy(&scores[i], &bits, 4);
    }
    std::shuffle(scores.begin(), scores.end(), rng_);
    return scores;
  };
  std::vector<float> scores = spaced(0, 0);
  TopkParams host{scores.data(), lens.data(), nullptr, n, 1, k};
  TopkSearch search = TopkSearchOf(host, 0);
  EXPECT_EQ(search.passes, 2);
  EXPECT_FALSE(search.from_list);
  TieAtTheKth(scores, n, k);
  search = TopkSearchOf(host, 0);
  EXPECT_EQ(search.passes, 2);
  EXPECT_TRUE(search.from_list);
  ExpectTopkEqualsReference(scores, lens, n, k, "tie at the k-th, from the lists", ws);
  scores = spaced(n - k - 2000, n - k + 1000);  // the k-th is ranked n - k
  host.scores = scores.data();
  search = TopkSearchOf(host, 0);
  EXPECT_EQ(search.passes, 3);
  EXPECT_FALSE(search.from_list);
  ExpectTopkEqualsReference(scores, lens, n, k, "3,000 ties at the k-th, third pass", ws);

  std::vector<float> normal_scores(n);
  std::normal_distribution<float> normal;
  for (float& x : normal_scores) x = normal(rng_);
  TieAtTheKth(normal_scores, n, k);
  host.scores = normal_scores.data();
  search = TopkSearchOf(host, 0);
  EXPECT_EQ(search.passes, 2);
  EXPECT_TRUE(search.from_list);
  ExpectTopkEqualsReference(normal_scores, lens, n, k, "normal scores tied at the k-th", ws);
  // Ties at the k-th in each of a batch of 32 rows (CTAs of 256 threads, digits of 11, 11 and 10).
  const int rows = 32, stride = 65536;
  std::vector<float> batch(size_t(rows) * stride);
  for (float& x : batch) x = normal(rng_);
  TieAtTheKth(batch, stride, k);
  std::vector<int32_t> batch_lens(rows, stride);
  TopkParams batch_host{batch.data(), batch_lens.data(), nullptr, stride, rows, k};
  for (int r = 0; r < rows; ++r) EXPECT_TRUE(TopkSearchOf(batch_host, r).from_list) << r;
  ExpectTopkEqualsReference(batch, batch_lens, stride, k, "batch tied at the k-th", ws);
}

TEST_F(CudaKernelsTest, TopkOfMoreRowsThanTheGpuHoldsAtOnce) {
  // 160 rows of 65,536 scores are 2,560 CTAs: several cooperative launches, one workspace.
  const int rows = 160, stride = 65536;
  std::vector<float> scores(size_t(rows) * stride);
  std::normal_distribution<float> normal;
  for (float& x : scores) x = normal(rng_);
  std::vector<int32_t> lens(rows);
  for (int r = 0; r < rows; ++r) lens[r] = r % 5 == 0 ? 1000 + r : stride - r;
  CudaWorkspace ws;
  ExpectTopkEqualsReference(scores, lens, stride, 2048, "160 rows", ws);
  ExpectTopkEqualsReference(scores, lens, stride, 100, "160 rows k=100", ws);
}

TEST_F(CudaKernelsTest, TopkTakesTheLongestRowsAndNamesTheLimitBeyond) {
  // 1,048,576 scores a row, the most the CTAs' register-held slices cover; ties across slices.
  const int stride = 1 << 20;
  std::vector<float> scores(size_t{2} * stride);
  std::uniform_int_distribution<int> levels(0, 400);
  for (float& x : scores) x = static_cast<float>(levels(rng_)) * 0.25f;
  CudaWorkspace ws;
  ExpectTopkEqualsReference(scores, {stride, stride - 12345}, stride, 2048, "longest rows", ws);
  DeviceBuffer ds = Up(std::vector<float>(stride + 1, 1.0f)), dl = Up(std::vector<int32_t>{1});
  DeviceBuffer di = Up(std::vector<int32_t>(16));
  TopkParams longer{ds.get<float>(), dl.get<int32_t>(), di.get<int32_t>(), stride + 1, 1, 16};
  const absl::Status s = TopkCuda(longer, ws, nullptr);
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("1,048,576"));
}

// --- block copy and synthetic ------------------------------------------------------------------

TEST_F(CudaKernelsTest, BlockGatherScatterMoveExactBytes) {
  const int64_t stride = 256 * 37, blocks = 40;
  std::vector<uint8_t> arena(stride * blocks);
  for (uint8_t& b : arena) b = static_cast<uint8_t>(rng_());
  std::vector<int32_t> ids = {5, 39, 0, 17, 22};
  std::vector<uint8_t> staging(ids.size() * stride);
  BlockCopyParams ref{arena.data(), blocks, stride, ids.data(), 5, staging.data()};
  ASSERT_TRUE(GatherBlocksRef(ref).ok());
  DeviceBuffer da = Up(arena), dids = Up(ids), dst = Up(std::vector<uint8_t>(staging.size()));
  BlockCopyParams dev{da.get<uint8_t>(),   blocks, stride,
                      dids.get<int32_t>(), 5,      dst.get<uint8_t>()};
  ASSERT_TRUE(GatherBlocksCuda(dev, nullptr).ok());
  EXPECT_EQ(Down<uint8_t>(dst, staging.size()), staging);
  std::vector<int32_t> to = {1, 2, 3, 4, 6};
  DeviceBuffer dto = Up(to), target = Up(std::vector<uint8_t>(arena.size(), 0xEE));
  std::vector<uint8_t> want(arena.size(), 0xEE);
  BlockCopyParams sref{want.data(), blocks, stride, to.data(), 5, staging.data()};
  ASSERT_TRUE(ScatterBlocksRef(sref).ok());
  BlockCopyParams sdev{target.get<uint8_t>(), blocks, stride,
                       dto.get<int32_t>(),    5,      dst.get<uint8_t>()};
  ASSERT_TRUE(ScatterBlocksCuda(sdev, nullptr).ok());
  EXPECT_EQ(Down<uint8_t>(target, arena.size()), want);
}

TEST_F(CudaKernelsTest, BlockMoveBetweenArenasMatchesTheReference) {
  const int64_t stride = 256 * 53, source_blocks = 50, target_blocks = 30;
  std::vector<uint8_t> source(stride * source_blocks);
  for (uint8_t& b : source) b = static_cast<uint8_t>(rng_());
  std::vector<int32_t> from = {49, 3, 4, 5, 0, 17}, to = {29, 0, 1, 2, 11, 12};
  std::vector<uint8_t> want(stride * target_blocks, 0x5A);
  BlockMoveParams ref{.source = source.data(), .num_source_blocks = source_blocks,
                      .target = want.data(), .num_target_blocks = target_blocks,
                      .block_stride = stride, .source_ids = from.data(), .target_ids = to.data(),
                      .num_blocks = 6};
  ASSERT_TRUE(MoveBlocksRef(ref).ok());
  DeviceBuffer ds = Up(source), dt = Up(std::vector<uint8_t>(want.size(), 0x5A));
  DeviceBuffer dfrom = Up(from), dto = Up(to);
  BlockMoveParams dev = ref;
  dev.source = ds.get<uint8_t>();
  dev.target = dt.get<uint8_t>();
  dev.source_ids = dfrom.get<int32_t>();
  dev.target_ids = dto.get<int32_t>();
  ASSERT_TRUE(MoveBlocksCuda(dev, nullptr).ok());
  EXPECT_EQ(Down<uint8_t>(dt, want.size()), want);
}

TEST_F(CudaKernelsTest, SyntheticGeneratorMatchesTheCpuBitForBit) {
  SyntheticConfig cfg;
  cfg.seed = rng_();
  SyntheticShape shape{4, 16, 128};
  std::vector<int32_t> tokens(333);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng_() % 100000);
  const size_t row = 4 * 128;
  std::vector<Bf16> k(tokens.size() * row), v(k.size()), ik(tokens.size() * 128);
  FillSyntheticTokens(cfg, shape, 5, tokens, 1000, k.data(), v.data(), ik.data());
  DeviceBuffer dt = Up(tokens), dk = Up(std::vector<Bf16>(k.size())),
               dv = Up(std::vector<Bf16>(v.size())), dik = Up(std::vector<Bf16>(ik.size()));
  SyntheticTokensParams p{cfg,
                          5,
                          4,
                          128,
                          dt.get<int32_t>(),
                          int64_t(tokens.size()),
                          1000,
                          dk.get<Bf16>(),
                          dv.get<Bf16>(),
                          dik.get<Bf16>()};
  ASSERT_TRUE(SyntheticTokensCuda(p, nullptr).ok());
  EXPECT_EQ(Bits(Down<Bf16>(dk, k.size())), Bits(k));
  EXPECT_EQ(Bits(Down<Bf16>(dv, v.size())), Bits(v));
  EXPECT_EQ(Bits(Down<Bf16>(dik, ik.size())), Bits(ik));
}

TEST_F(CudaKernelsTest, SyntheticTokensAtTheirOwnPositionsMatchTheCpu) {
  SyntheticConfig cfg;
  cfg.seed = rng_();
  SyntheticShape shape{8, 32, 128};
  std::vector<int32_t> tokens(17), positions(17);
  for (int i = 0; i < 17; ++i) {
    tokens[i] = static_cast<int32_t>(rng_() % 100000);
    positions[i] = static_cast<int32_t>(rng_() % 200000);
  }
  const size_t row = 8 * 128;
  std::vector<Bf16> k(tokens.size() * row), v(k.size()), ik(tokens.size() * 128);
  for (size_t t = 0; t < tokens.size(); ++t) {
    FillSyntheticTokens(cfg, shape, 3, std::span<const int32_t>(&tokens[t], 1), positions[t],
                        &k[t * row], &v[t * row], &ik[t * 128]);
  }
  DeviceBuffer dt = Up(tokens), dpos = Up(positions), dk = Up(std::vector<Bf16>(k.size())),
               dv = Up(std::vector<Bf16>(v.size())), dik = Up(std::vector<Bf16>(ik.size()));
  SyntheticTokensParams p;
  p.config = cfg;
  p.layer = 3;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.tokens = dt.get<int32_t>();
  p.num_tokens = int64_t(tokens.size());
  p.k = dk.get<Bf16>();
  p.v = dv.get<Bf16>();
  p.index_k = dik.get<Bf16>();
  p.positions = dpos.get<int32_t>();
  ASSERT_TRUE(SyntheticTokensCuda(p, nullptr).ok());
  EXPECT_EQ(Bits(Down<Bf16>(dk, k.size())), Bits(k));
  EXPECT_EQ(Bits(Down<Bf16>(dv, v.size())), Bits(v));
  EXPECT_EQ(Bits(Down<Bf16>(dik, ik.size())), Bits(ik));
}

TEST_F(CudaKernelsTest, SyntheticQueriesMatchTheCpuBitForBit) {
  SyntheticConfig cfg;
  cfg.seed = rng_();
  const SyntheticShape shape{8, 32, 128};
  constexpr int kSteps = 5;
  std::vector<uint64_t> seeds(kSteps);
  std::vector<int32_t> needle_pos(kSteps), needle_tok(kSteps);
  std::vector<float> gains(kSteps);
  const size_t q_row = 32 * 128, idx_row = 64 * 128;
  std::vector<Bf16> q(kSteps * q_row), iq(kSteps * idx_row);
  std::vector<float> w(kSteps * 64);
  for (int s = 0; s < kSteps; ++s) {
    seeds[s] = rng_();
    needle_pos[s] = s % 2 == 0 ? static_cast<int32_t>(rng_() % 5000) : -1;
    needle_tok[s] = static_cast<int32_t>(rng_() % 100000);
    gains[s] = 0.25f + 0.1f * s;
    const SyntheticNeedle needle{needle_pos[s], needle_tok[s], gains[s]};
    const SyntheticNeedle* n = needle_pos[s] >= 0 ? &needle : nullptr;
    FillSyntheticQuery(cfg, shape, 2, seeds[s], n, &q[s * q_row]);
    FillSyntheticIndexQuery(cfg, 2, seeds[s], n, &iq[s * idx_row], &w[s * 64]);
  }
  DeviceBuffer dseeds = Up(seeds), dpos = Up(needle_pos), dtok = Up(needle_tok), dg = Up(gains),
               dq = Up(std::vector<Bf16>(q.size())), diq = Up(std::vector<Bf16>(iq.size())),
               dw = Up(std::vector<float>(w.size()));
  SyntheticQueriesParams p;
  p.config = cfg;
  p.layer = 2;
  p.num_steps = kSteps;
  p.num_q_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.step_seeds = dseeds.get<uint64_t>();
  p.needle_positions = dpos.get<int32_t>();
  p.needle_tokens = dtok.get<int32_t>();
  p.needle_gains = dg.get<float>();
  p.q = dq.get<Bf16>();
  p.index_q = diq.get<Bf16>();
  p.weights = dw.get<float>();
  ASSERT_TRUE(SyntheticQueriesCuda(p, nullptr).ok());
  EXPECT_EQ(Bits(Down<Bf16>(dq, q.size())), Bits(q));
  EXPECT_EQ(Bits(Down<Bf16>(diq, iq.size())), Bits(iq));
  const std::vector<float> got_w = Down<float>(dw, w.size());
  EXPECT_EQ(0, std::memcmp(got_w.data(), w.data(), w.size() * sizeof(float)));
}

}  // namespace
}  // namespace kvp
