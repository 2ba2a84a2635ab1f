// The CPU references of the MLA cache write and sparse MLA decode (kernels/mla/mla_ref.h): the
// bytes the write leaves, and what the decode computes on -1 slots, all-invalid rows, NaN-filled
// unused slots, block sizes that are not powers of two, and every head count.
#include "kernels/mla/mla_ref.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/layout/block_layout.h"
#include "tests/testing/mla_layer.h"

namespace kvp {
namespace {

// An MLA layer of `num_blocks` blocks of `block_size` tokens in host memory, every byte 0xFF (a
// NaN latent with NaN scales) until written.
struct Arena {
  Arena(int num_blocks, int block_size)
      : bytes(static_cast<size_t>(num_blocks) * testing::MlaLayerStride(block_size), 0xFF),
        cache(testing::MlaLayer(bytes.data(), num_blocks, block_size)) {}
  std::vector<uint8_t> bytes;
  LayerCache cache;
};

std::vector<Bf16> RandomBf16(std::mt19937& rng, size_t n, float spread) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<Bf16> v(n);
  for (Bf16& x : v) x = Bf16FromFloat(normal(rng));
  return v;
}

// Writes `n` random tokens at `slots`.
void WriteTokens(Arena& a, const std::vector<int64_t>& slots, std::mt19937& rng) {
  const std::vector<Bf16> latent = RandomBf16(rng, slots.size() * 512, 1.0f);
  const std::vector<Bf16> rope = RandomBf16(rng, slots.size() * 64, 1.0f);
  MlaCacheWriteParams w{.cache = a.cache, .latent = latent.data(), .rope = rope.data(),
                        .slots = slots.data(), .num_tokens = static_cast<int32_t>(slots.size())};
  ASSERT_TRUE(MlaCacheWriteRef(w).ok());
}

struct Decoded {
  std::vector<Bf16> out;
  std::vector<float> lse;
};

absl::StatusOr<Decoded> Decode(const Arena& a, const std::vector<Bf16>& q,
                               const std::vector<int32_t>& slots, int batch, int s_q, int heads,
                               int topk) {
  Decoded d{std::vector<Bf16>(size_t(batch) * s_q * heads * 512),
            std::vector<float>(size_t(batch) * s_q * heads)};
  SparseMlaDecodeParams p{.cache = a.cache, .q = q.data(), .slots = slots.data(),
                          .batch = batch, .s_q = s_q, .heads = heads, .topk = topk,
                          .softmax_scale = kDeepSeekV32SoftmaxScale, .out = d.out.data(),
                          .lse = d.lse.data()};
  if (absl::Status s = SparseMlaDecodeRef(p); !s.ok()) return s;
  return d;
}

TEST(MlaCacheWriteRefTest, WritesEachTokensBytesAtItsSlot) {
  std::mt19937 rng(1);
  Arena a(6, 48);  // 48 tokens a block: not a power of two
  const std::vector<int64_t> slots = {0, 47, 48, 200, -1, 287};
  const std::vector<Bf16> latent = RandomBf16(rng, slots.size() * 512, 3.0f);
  const std::vector<Bf16> rope = RandomBf16(rng, slots.size() * 64, 3.0f);
  MlaCacheWriteParams w{.cache = a.cache, .latent = latent.data(), .rope = rope.data(),
                        .slots = slots.data(), .num_tokens = 6};
  ASSERT_TRUE(MlaCacheWriteRef(w).ok());
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    float token[576];
    for (int i = 0; i < 512; ++i) token[i] = Bf16ToFloat(latent[t * 512 + i]);
    for (int i = 0; i < 64; ++i) token[512 + i] = Bf16ToFloat(rope[t * 64 + i]);
    uint8_t want[656];
    EncodeMlaToken(token, want);
    const uint8_t* at = a.bytes.data() + (slots[t] / 48) * a.cache.block_stride + (slots[t] % 48) * 656;
    EXPECT_EQ(std::memcmp(at, want, 656), 0) << "slot " << slots[t];
  }
  EXPECT_EQ(a.bytes[size_t(1) * 656], 0xFF) << "slot 1 was not written";
  const std::vector<int64_t> bad = {288};
  w.slots = bad.data();
  w.num_tokens = 1;
  EXPECT_EQ(MlaCacheWriteRef(w).code(), absl::StatusCode::kOutOfRange);
}

TEST(MlaCacheWriteRefTest, ReadsRowsOfOneTokenTensorAndWritesIndexKeys) {
  std::mt19937 rng(2);
  const BlockLayout layout = BlockLayout::Create(MlaPoolSpec(2, 16, true)).value();
  std::vector<uint8_t> arena(3 * layout.block_stride(), 0xFF);
  const LayerCache cache = layout.Layer(arena.data(), 3, 1);
  const std::vector<int64_t> slots = {5, 16, 47};
  // [tokens, 576] rows: the latent and RoPE parts are slices 576 apart.
  const std::vector<Bf16> rows = RandomBf16(rng, slots.size() * 576, 2.0f);
  const std::vector<Bf16> index_k = RandomBf16(rng, slots.size() * 128, 1.0f);
  MlaCacheWriteParams w{.cache = cache, .latent = rows.data(), .rope = rows.data() + 512,
                        .index_k = index_k.data(), .slots = slots.data(), .num_tokens = 3,
                        .latent_stride = 576, .rope_stride = 576};
  ASSERT_TRUE(MlaCacheWriteRef(w).ok());
  for (size_t t = 0; t < slots.size(); ++t) {
    float token[576], key[128];
    for (int i = 0; i < 576; ++i) token[i] = Bf16ToFloat(rows[t * 576 + i]);
    for (int i = 0; i < 128; ++i) key[i] = Bf16ToFloat(index_k[t * 128 + i]);
    uint8_t want[656], want_index[128], want_scale[4];
    EncodeMlaToken(token, want);
    EncodeHead(cache.index_codec, key, 128, want_index, want_scale);
    const int64_t b = slots[t] / 16;
    const int o = static_cast<int>(slots[t] % 16);
    EXPECT_EQ(std::memcmp(cache.Latent(b, o), want, 656), 0) << slots[t];
    EXPECT_EQ(std::memcmp(cache.IndexValues(b, o), want_index, 128), 0) << slots[t];
    EXPECT_EQ(std::memcmp(cache.IndexScale(b, o), want_scale, 4), 0) << slots[t];
  }
  w.index_k = nullptr;
  EXPECT_EQ(MlaCacheWriteRef(w).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SlotsOfPositionsRefTest, PositionsGoThroughEachRowsBlocks) {
  const std::vector<int32_t> tables = {7, 2, 0,   // row 0: blocks 7, 2
                                       4, 9, 1};  // row 1: blocks 4, 9, 1
  const std::vector<int32_t> positions = {0, 17, -1, 40, 16, -1};
  std::vector<int32_t> slots(6);
  SlotsOfPositionsParams p{.positions = positions.data(), .block_tables = tables.data(),
                           .block_table_stride = 3, .block_size = 16, .slots = slots.data(),
                           .rows = 2, .k = 3};
  ASSERT_TRUE(SlotsOfPositionsRef(p).ok());
  EXPECT_EQ(slots, (std::vector<int32_t>{7 * 16, 2 * 16 + 1, -1, 1 * 16 + 8, 9 * 16, -1}));
  const std::vector<int32_t> past = {48, 0, 0, 0, 0, 0};
  p.positions = past.data();
  EXPECT_EQ(SlotsOfPositionsRef(p).code(), absl::StatusCode::kOutOfRange);
}

TEST(SparseMlaDecodeRefTest, OneSlotGivesItsLatentAndItsScore) {
  std::mt19937 rng(2);
  Arena a(2, 64);
  WriteTokens(a, {70}, rng);
  const std::vector<Bf16> q = RandomBf16(rng, 16 * 576, 0.2f);
  absl::StatusOr<Decoded> d = Decode(a, q, {-1, 70, -1}, 1, 1, 16, 3);
  ASSERT_TRUE(d.ok()) << d.status();
  float token[576];
  DecodeMlaToken(a.cache.LatentOfSlot(70), token);
  for (int h = 0; h < 16; ++h) {
    double dot = 0;
    for (int i = 0; i < 576; ++i) dot += double{Bf16ToFloat(q[h * 576 + i])} * token[i];
    EXPECT_NEAR(d->lse[h], kDeepSeekV32SoftmaxScale * dot, 1e-4) << h;
    for (int i = 0; i < 512; ++i) ASSERT_EQ(d->out[h * 512 + i].bits, Bf16FromFloat(token[i]).bits);
  }
}

TEST(SparseMlaDecodeRefTest, UnusedSlotsAndNanFilledCacheDoNotCount) {
  std::mt19937 rng(3);
  Arena a(4, 32);
  WriteTokens(a, {3, 40, 77, 100}, rng);  // every other slot stays NaN bytes
  const std::vector<Bf16> q = RandomBf16(rng, 2 * 32 * 576, 0.1f);
  absl::StatusOr<Decoded> packed = Decode(a, q, {3, 40, 77, 100, 100, 3}, 1, 2, 32, 3);
  ASSERT_FALSE(packed.ok()) << "a repeated slot is refused";
  packed = Decode(a, q, {3, 40, 77, 100, 77, 3}, 1, 2, 32, 3);
  absl::StatusOr<Decoded> padded =
      Decode(a, q, {-1, 3, -1, 40, 77, -1, -1, 100, 77, -1, 3, -1}, 1, 2, 32, 6);
  ASSERT_TRUE(packed.ok() && padded.ok());
  for (size_t i = 0; i < packed->out.size(); ++i) {
    ASSERT_EQ(packed->out[i].bits, padded->out[i].bits) << i;
    ASSERT_FALSE(std::isnan(Bf16ToFloat(packed->out[i]))) << i;
  }
  EXPECT_EQ(packed->lse, padded->lse);
}

TEST(SparseMlaDecodeRefTest, ARowWithoutValidSlotsGivesZerosAndMinusInfinity) {
  std::mt19937 rng(4);
  Arena a(1, 16);
  const std::vector<Bf16> q = RandomBf16(rng, 2 * 64 * 576, 0.1f);
  WriteTokens(a, {5}, rng);
  absl::StatusOr<Decoded> d = Decode(a, q, {-1, -1, 5, -1}, 2, 1, 64, 2);  // row 0: none
  ASSERT_TRUE(d.ok());
  for (int h = 0; h < 64; ++h) {
    EXPECT_EQ(d->lse[h], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isfinite(d->lse[64 + h]));
    for (int i = 0; i < 512; ++i) ASSERT_EQ(Bf16ToFloat(d->out[h * 512 + i]), 0.0f);
  }
  // No slots at all (top-0: a zero-length sequence).
  EXPECT_TRUE(Decode(a, q, {}, 2, 1, 64, 0).ok());
  EXPECT_EQ(Decode(a, q, {-2, 5}, 1, 1, 64, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Decode(a, q, {16, 5}, 1, 1, 64, 2).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(SparseMlaDecodeRefTest, WeightsFollowTheScaledScores) {
  std::mt19937 rng(5);
  Arena a(1, 64);
  WriteTokens(a, {0, 1}, rng);
  float t0[576], t1[576];
  DecodeMlaToken(a.cache.LatentOfSlot(0), t0);
  DecodeMlaToken(a.cache.LatentOfSlot(1), t1);
  for (int heads : {16, 32, 64, 128}) {
    const std::vector<Bf16> q = RandomBf16(rng, size_t(heads) * 576, 0.3f);
    absl::StatusOr<Decoded> d = Decode(a, q, {0, 1}, 1, 1, heads, 2);
    ASSERT_TRUE(d.ok());
    for (int h = 0; h < heads; ++h) {
      double s0 = 0, s1 = 0;
      for (int i = 0; i < 576; ++i) {
        s0 += double{Bf16ToFloat(q[h * 576 + i])} * t0[i];
        s1 += double{Bf16ToFloat(q[h * 576 + i])} * t1[i];
      }
      s0 *= kDeepSeekV32SoftmaxScale;
      s1 *= kDeepSeekV32SoftmaxScale;
      const double w1 = 1.0 / (1.0 + std::exp(s0 - s1));
      const int i = h % 512;
      EXPECT_NEAR(Bf16ToFloat(d->out[h * 512 + i]), (1 - w1) * t0[i] + w1 * t1[i],
                  0.01 * (std::fabs(t0[i]) + std::fabs(t1[i])) + 1e-3)
          << heads << " heads, head " << h;
      EXPECT_NEAR(d->lse[h], std::max(s0, s1) + std::log1p(std::exp(-std::fabs(s0 - s1))), 1e-4);
    }
  }
}

}  // namespace
}  // namespace kvp
