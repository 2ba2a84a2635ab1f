#include "kernels/cache_write/cache_write_ref.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/layout/block_layout.h"
#include "tests/testing/test_pool.h"

namespace kvp {
namespace {

using testing::RandomBf16;

constexpr uint8_t kSentinel = 0xA5;

std::vector<float> Widen(const Bf16* x, int n) {
  std::vector<float> out(n);
  for (int i = 0; i < n; ++i) out[i] = Bf16ToFloat(x[i]);
  return out;
}

class CacheWriteRefTest : public ::testing::TestWithParam<KvFormat> {};

// Every byte of the arena after the write equals a from-scratch expectation: the sentinel
// everywhere except the addressed rows, whose offsets are spelled out here from docs/design.md §4.
TEST_P(CacheWriteRefTest, WritesExactlyTheAddressedRows) {
  PoolSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 3;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.k_format = GetParam() == KvFormat::kBf16 ? KvFormat::kBf16 : KvFormat::kFp8E4m3;
  spec.v_format = GetParam();
  spec.indexer = true;
  spec.k_scales = {1.0f, 0.5f};
  spec.v_scales = {1.0f, 0.125f};
  const BlockLayout layout = BlockLayout::Create(spec).value();
  constexpr int64_t kBlocks = 6;
  std::vector<uint8_t> arena(kBlocks * layout.block_stride(), kSentinel);
  std::vector<uint8_t> expected = arena;

  std::mt19937_64 rng(std::random_device{}());
  constexpr int kTokens = 40;
  const int row = spec.num_kv_heads * spec.head_dim;
  const auto k = RandomBf16(rng, kTokens * row, 2.0f);
  const auto v = RandomBf16(rng, kTokens * row, 0.5f);
  const auto index_k = RandomBf16(rng, kTokens * kIndexHeadDim);
  std::vector<int64_t> slots(kTokens);
  std::vector<int64_t> all(kBlocks * spec.block_size);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  for (int t = 0; t < kTokens; ++t) slots[t] = t % 7 == 3 ? -1 : all[t];

  const int layer = 1;
  CacheWriteParams p;
  p.cache = layout.Layer(arena.data(), kBlocks, layer);
  p.k = k.data();
  p.v = v.data();
  p.index_k = index_k.data();
  p.slot_mapping = slots.data();
  p.num_tokens = kTokens;
  ASSERT_TRUE(CacheWriteRef(p).ok());

  const SectionOffsets& s = layout.sections(layer);
  const FormatTraits kt = TraitsOf(spec.k_format), vt = TraitsOf(spec.v_format);
  const int64_t kb = kt.DataBytes(64), vb = vt.DataBytes(64), sb = vt.ScaleBytes(64);
  HeadCodec k_codec{spec.k_format, 0.5f, false, true, {}};
  HeadCodec v_codec{spec.v_format, 0.125f, true, true, MakeRotationSigns(64)};
  HeadCodec i_codec{KvFormat::kIndexer, 1.0f, false, true, {}};
  for (int t = 0; t < kTokens; ++t) {
    if (slots[t] < 0) continue;
    uint8_t* block = expected.data() + slots[t] / 16 * layout.block_stride();
    const int64_t off = slots[t] % 16;
    for (int h = 0; h < 3; ++h) {
      const int64_t th = off * 3 + h;
      EncodeHead(k_codec, Widen(&k[(t * 3 + h) * 64], 64).data(), 64, block + s.k + th * kb,
                 nullptr);
      EncodeHead(v_codec, Widen(&v[(t * 3 + h) * 64], 64).data(), 64, block + s.v_data + th * vb,
                 block + s.v_scale + th * sb);
    }
    EncodeHead(i_codec, Widen(&index_k[t * 128], 128).data(), 128,
               block + s.index_values + off * 128, block + s.index_scales + off * 4);
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < arena.size(); ++i) mismatches += arena[i] != expected[i];
  EXPECT_EQ(mismatches, 0u);
}

TEST_P(CacheWriteRefTest, WrittenTokensDecodeCloseToTheirInputs) {
  PoolSpec spec;
  spec.num_kv_heads = 2;
  spec.v_format = GetParam();
  spec.k_format = GetParam() == KvFormat::kBf16 ? KvFormat::kBf16 : KvFormat::kFp8E4m3;
  spec.indexer = true;
  testing::TestPool pool(spec, 4);
  std::mt19937_64 rng(std::random_device{}());
  const auto k = RandomBf16(rng, 64 * 2 * 128);
  const auto v = RandomBf16(rng, 64 * 2 * 128);
  const auto index_k = RandomBf16(rng, 64 * 128);
  std::vector<int64_t> slots(64);
  for (int t = 0; t < 64; ++t) slots[t] = 128 + t;  // block 2
  CacheWriteParams p{pool.Layer(0), k.data(), v.data(), index_k.data(), slots.data(), 64};
  ASSERT_TRUE(CacheWriteRef(p).ok());
  const LayerCache c = pool.Layer(0);
  double k_err = 0, k_ref = 0, v_err = 0, v_ref = 0, i_err = 0, i_ref = 0;
  std::vector<float> back(128);
  for (int t = 0; t < 64; ++t) {
    for (int h = 0; h < 2; ++h) {
      DecodeHead(c.k_codec, c.K(2, t, h), nullptr, 128, back.data());
      for (int e = 0; e < 128; ++e) {
        const float x = Bf16ToFloat(k[(t * 2 + h) * 128 + e]);
        k_err += std::pow(back[e] - x, 2);
        k_ref += x * x;
      }
      DecodeHead(c.v_codec, c.VData(2, t, h), c.VScale(2, t, h), 128, back.data());
      for (int e = 0; e < 128; ++e) {
        const float x = Bf16ToFloat(v[(t * 2 + h) * 128 + e]);
        v_err += std::pow(back[e] - x, 2);
        v_ref += x * x;
      }
    }
    DecodeHead(c.index_codec, c.IndexValues(2, t), c.IndexScale(2, t), 128, back.data());
    for (int e = 0; e < 128; ++e) {
      const float x = Bf16ToFloat(index_k[t * 128 + e]);
      i_err += std::pow(back[e] - x, 2);
      i_ref += x * x;
    }
  }
  const double v_limit = GetParam() == KvFormat::kBf16     ? 0.0
                         : GetParam() == KvFormat::kTurbo2 ? 0.14
                         : GetParam() == KvFormat::kTurbo3 ? 0.03
                                                           : 0.008;
  EXPECT_LE(k_err / k_ref, GetParam() == KvFormat::kBf16 ? 0.0 : 2e-3);
  EXPECT_LE(v_err / v_ref, v_limit);
  EXPECT_LE(i_err / i_ref, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(ValueFormats, CacheWriteRefTest,
                         ::testing::Values(KvFormat::kBf16, KvFormat::kTurbo2, KvFormat::kTurbo3,
                                           KvFormat::kTurbo4));

TEST(CacheWriteRefErrorsTest, BadSlotsOrMissingInputsWriteNothing) {
  PoolSpec spec;
  spec.indexer = true;
  testing::TestPool pool(spec, 2);
  const std::vector<uint8_t> before = pool.arena();
  std::mt19937_64 rng(1);
  const auto k = RandomBf16(rng, 2 * 8 * 128);
  const auto index_k = RandomBf16(rng, 2 * 128);
  std::vector<int64_t> slots = {5, 128};  // the arena has 128 slots
  CacheWriteParams p{pool.Layer(0), k.data(), k.data(), index_k.data(), slots.data(), 2};
  EXPECT_EQ(CacheWriteRef(p).code(), absl::StatusCode::kOutOfRange);
  slots[1] = -2;
  EXPECT_EQ(CacheWriteRef(p).code(), absl::StatusCode::kOutOfRange);
  slots[1] = 6;
  p.index_k = nullptr;
  EXPECT_EQ(CacheWriteRef(p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.arena(), before);
}

}  // namespace
}  // namespace kvp
