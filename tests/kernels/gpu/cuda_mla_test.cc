// The MLA kernels on the GPU against their CPU references (kernels/mla/mla_ref.h): the cache
// write bit for bit, sparse MLA decode within bf16 rounding of K, on block sizes that are not powers
// of two, -1 slots, rows with no valid slot and an arena whose unused slots hold NaN bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_ops.h"
#include "kernels/mla/mla_ref.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/layout/block_layout.h"
#include "tests/kernels/gpu/cuda_test_support.h"
#include "tests/testing/mla_layer.h"

namespace kvp {
namespace {

// An MLA layer of host memory and its device copy's view, every byte 0xFF until written.
struct MlaArena {
  MlaArena(int blocks, int block_size)
      : host(static_cast<size_t>(blocks) * testing::MlaLayerStride(block_size), 0xFF),
        cache(testing::MlaLayer(host.data(), blocks, block_size)) {}
  LayerCache On(const DeviceBuffer& d) const {
    LayerCache c = cache;
    c.base = d.get<uint8_t>();
    return c;
  }
  int64_t slots() const { return cache.num_blocks * cache.block_size; }
  std::vector<uint8_t> host;
  LayerCache cache;
};

std::vector<Bf16> RandomBf16(std::mt19937_64& rng, size_t n, float spread) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<Bf16> v(n);
  for (Bf16& x : v) x = Bf16FromFloat(normal(rng));
  return v;
}

// `n` distinct random slots of the arena. REQUIRES: n <= slots.
std::vector<int64_t> DistinctSlots(std::mt19937_64& rng, int64_t slots, size_t n) {
  EXPECT_LE(n, static_cast<size_t>(slots));
  std::vector<int64_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

using CudaMlaTest = CudaKernelsTest;

TEST_F(CudaMlaTest, CacheWriteIsBitIdenticalToTheReference) {
  for (int block_size : {64, 48, 16}) {
    MlaArena arena(40, block_size);  // 640 slots or more: room for 300 distinct ones
    const size_t n = 300;
    std::vector<int64_t> slots = DistinctSlots(rng_, arena.slots(), n);
    slots[7] = -1;  // padding
    std::vector<Bf16> latent = RandomBf16(rng_, n * 512, 2.0f);
    std::vector<Bf16> rope = RandomBf16(rng_, n * 64, 2.0f);
    // Edge values: NaN, infinities, a zero tile, subnormal-sized values, a huge one.
    latent[3] = Bf16FromFloat(kNan);
    latent[600] = Bf16FromFloat(std::numeric_limits<float>::infinity());
    for (int i = 0; i < 128; ++i) latent[2 * 512 + 128 + i] = Bf16FromFloat(0.0f);
    for (int i = 0; i < 128; ++i) latent[4 * 512 + i] = Bf16FromFloat(1e-30f * (i - 64));
    latent[5 * 512 + 9] = Bf16FromFloat(3e38f);
    rope[11] = Bf16FromFloat(kNan);
    DeviceBuffer d_arena = Up(arena.host);
    MlaCacheWriteParams p{.cache = arena.cache, .latent = latent.data(), .rope = rope.data(),
                          .slots = slots.data(), .num_tokens = static_cast<int32_t>(n)};
    ASSERT_TRUE(MlaCacheWriteRef(p).ok());
    DeviceBuffer d_latent = Up(latent), d_rope = Up(rope), d_slots = Up(slots);
    MlaCacheWriteParams d{.cache = arena.On(d_arena),
                          .latent = d_latent.get<Bf16>(),
                          .rope = d_rope.get<Bf16>(),
                          .slots = d_slots.get<int64_t>(),
                          .num_tokens = static_cast<int32_t>(n)};
    ASSERT_TRUE(MlaCacheWriteCuda(d, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = Down<uint8_t>(d_arena, arena.host.size());
    for (size_t b = 0; b < got.size(); ++b) {
      ASSERT_EQ(got[b], arena.host[b]) << "byte " << b << ", block size " << block_size;
    }
  }
}

// In a pool's layer (the latent, then the indexer's sections) from one [tokens, 576] tensor: the
// latents and the index keys bit for bit, every other byte untouched.
TEST_F(CudaMlaTest, CacheWriteOfAPoolLayerWritesIndexKeysBitForBit) {
  for (bool ue8m0 : {true, false}) {
    const BlockLayout layout = BlockLayout::Create(MlaPoolSpec(3, 64, ue8m0)).value();
    const int blocks = 12;
    std::vector<uint8_t> host(static_cast<size_t>(blocks) * layout.block_stride(), 0xFF);
    const size_t n = 500;
    std::vector<int64_t> slots = DistinctSlots(rng_, int64_t{blocks} * 64, n);
    slots[3] = -1;
    const std::vector<Bf16> rows = RandomBf16(rng_, n * 576, 1.5f);
    std::vector<Bf16> index_k = RandomBf16(rng_, n * 128, 0.7f);
    index_k[5] = Bf16FromFloat(kNan);
    MlaCacheWriteParams p{.cache = layout.Layer(host.data(), blocks, 1),
                          .latent = rows.data(),
                          .rope = rows.data() + 512,
                          .index_k = index_k.data(),
                          .slots = slots.data(),
                          .num_tokens = static_cast<int32_t>(n),
                          .latent_stride = 576,
                          .rope_stride = 576};
    DeviceBuffer d_arena = Up(host);
    ASSERT_TRUE(MlaCacheWriteRef(p).ok());
    DeviceBuffer d_rows = Up(rows), d_index = Up(index_k), d_slots = Up(slots);
    MlaCacheWriteParams d = p;
    d.cache = layout.Layer(d_arena.get<uint8_t>(), blocks, 1);
    d.latent = d_rows.get<Bf16>();
    d.rope = d_rows.get<Bf16>() + 512;
    d.index_k = d_index.get<Bf16>();
    d.slots = d_slots.get<int64_t>();
    ASSERT_TRUE(MlaCacheWriteCuda(d, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = Down<uint8_t>(d_arena, host.size());
    for (size_t b = 0; b < got.size(); ++b) {
      ASSERT_EQ(got[b], host[b]) << "byte " << b << ", ue8m0 " << ue8m0;
    }
  }
}

TEST_F(CudaMlaTest, TopkPositionsBecomeTheirSlots) {
  const int rows = 300, k = 2048, stride = 70, block_size = 64;
  std::vector<int32_t> tables(rows * stride), positions(rows * k), want(rows * k);
  std::uniform_int_distribution<int32_t> block(0, 100000), position(-1, stride * block_size - 1);
  for (int32_t& b : tables) b = block(rng_);
  for (int32_t& p : positions) p = position(rng_);
  SlotsOfPositionsParams p{.positions = positions.data(), .block_tables = tables.data(),
                           .block_table_stride = stride, .block_size = block_size,
                           .slots = want.data(), .rows = rows, .k = k};
  ASSERT_TRUE(SlotsOfPositionsRef(p).ok());
  DeviceBuffer d_tables = Up(tables), d_positions = Up(positions), d_slots = Up(want);
  p.positions = d_positions.get<int32_t>();
  p.block_tables = d_tables.get<int32_t>();
  p.slots = d_slots.get<int32_t>();
  ASSERT_EQ(cudaMemset(p.slots, 0, want.size() * 4), cudaSuccess);
  ASSERT_TRUE(SlotsOfPositionsCuda(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(Down<int32_t>(d_slots, want.size()), want);
}

// What to decode: q [batch, s_q, heads, 576], row r's top-k slots[r · topk, (r + 1) · topk) (-1
// unused), with the top-k split over at most max_splits CTAs (0: as the launcher plans).
struct DecodeShape {
  int batch = 1;
  int s_q = 1;
  int heads = 0;
  int max_splits = 0;
};
// The outputs and log-sum-exps of a decode, on the GPU or by the reference.
enum class Decoder { kReference, kGpu };
struct MlaDecodeRun {
  std::vector<Bf16> out;
  std::vector<float> lse;
};
MlaDecodeRun Decode(Decoder decoder, const MlaArena& arena, const DeviceBuffer& d_arena,
                    const std::vector<Bf16>& q, const std::vector<int32_t>& slots,
                    DecodeShape shape) {
  const int rows = shape.batch * shape.s_q;
  const int topk = static_cast<int>(slots.size()) / rows;
  MlaDecodeRun run{std::vector<Bf16>(size_t(rows) * shape.heads * 512),
                   std::vector<float>(size_t(rows) * shape.heads)};
  SparseMlaDecodeParams p{.cache = arena.cache, .q = q.data(), .slots = slots.data(),
                          .batch = shape.batch, .s_q = shape.s_q, .heads = shape.heads,
                          .topk = topk, .softmax_scale = kDeepSeekV32SoftmaxScale,
                          .max_splits = shape.max_splits,
                          .out = run.out.data(), .lse = run.lse.data()};
  if (decoder == Decoder::kReference) {
    EXPECT_TRUE(SparseMlaDecodeRef(p).ok());
    return run;
  }
  DeviceBuffer d_q = Up(q), d_slots = Up(slots);
  DeviceBuffer d_out = Up(run.out), d_lse = Up(run.lse);
  p.cache = arena.On(d_arena);
  p.q = d_q.get<Bf16>();
  p.slots = d_slots.get<int32_t>();
  p.out = d_out.get<Bf16>();
  p.lse = d_lse.get<float>();
  CudaWorkspace workspace;
  EXPECT_TRUE(SparseMlaDecodeCuda(p, workspace, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run.out = Down<Bf16>(d_out, run.out.size());
  run.lse = Down<float>(d_lse, run.lse.size());
  return run;
}

// A row whose top-k holds one token outputs that token's latent as the tensor cores saw it: the
// dequantization of every E4M3 code (NaN aside) under scales that are powers of two (exact) or not
// (one bf16 step at most from the rounded product), in both kernels.
TEST_F(CudaMlaTest, SparseDecodeOfOneTokenGivesEveryCodesValue) {
  MlaArena arena(4, 16);
  // 127.3 and 128: either side of the split scale's limit (kPrescaledScaleLimit).
  const float scales[] = {1.0f, 0x1p-10f, 0.7f, 3.0e5f, 1e-30f, 0x1p40f, 127.3f, 128.0f};
  const int tokens = 12;
  for (int t = 0; t < tokens; ++t) {
    uint8_t* entry = arena.cache.LatentOfSlot(t);
    for (int i = 0; i < 512; ++i) {
      const uint8_t code = static_cast<uint8_t>(i + 37 * t);
      entry[i] = (code & 0x7F) == kE4m3NanCode ? 0 : code;
    }
    for (int tile = 0; tile < 4; ++tile) {
      std::memcpy(entry + kMlaScalesOffset + 4 * tile, &scales[(4 * t + tile) % 8], 4);
    }
    const std::vector<Bf16> rope = RandomBf16(rng_, 64, 1.0f);
    std::memcpy(entry + kMlaRopeOffset, rope.data(), 128);
  }
  DeviceBuffer d_arena = Up(arena.host);
  for (int heads : {16, 64, 128}) {
    std::vector<int32_t> slots(tokens * 2, -1);
    for (int t = 0; t < tokens; ++t) slots[2 * t + 1] = t;
    const std::vector<Bf16> q = RandomBf16(rng_, size_t(tokens) * heads * 576, 0.01f);
    const MlaDecodeRun run =
        Decode(Decoder::kGpu, arena, d_arena, q, slots, {.batch = tokens, .heads = heads});
    for (int t = 0; t < tokens; ++t) {
      const uint8_t* entry = arena.cache.LatentOfSlot(t);
      for (int i = 0; i < 512; ++i) {
        float scale;
        std::memcpy(&scale, entry + kMlaScalesOffset + 4 * (i / 128), 4);
        const Bf16 want = Bf16FromFloat(MulRn(E4m3ToFloat(entry[i]), scale));
        const bool exact =
            scale == 1.0f || scale == 0x1p-10f || scale == 0x1p40f || scale == 128.0f;
        for (int h = 0; h < heads; h += heads - 1) {
          const Bf16 got = run.out[(size_t(t) * heads + h) * 512 + i];
          SCOPED_TRACE(::testing::Message() << heads << " heads, code " << int(entry[i])
                                            << ", scale " << scale << ", head " << h);
          if (Bf16ToFloat(want) == 0.0f) {  // code 0x80 too: the weighted sum's zero is +0
            ASSERT_EQ(Bf16ToFloat(got), 0.0f);
          } else if (exact || want.bits == got.bits) {
            ASSERT_EQ(got.bits, want.bits);
          } else {
            ASSERT_EQ(got.bits >> 15, want.bits >> 15) << "the sign";
            ASSERT_EQ(std::abs(int(got.bits) - int(want.bits)), 1) << "one bf16 step";
          }
        }
      }
    }
  }
}

// A NaN code in a chosen token makes its rows NaN, as in the reference (E4M3 NaN is kept).
TEST_F(CudaMlaTest, SparseDecodeKeepsANanCodeOfAChosenToken) {
  MlaArena arena(4, 16);
  const std::vector<int64_t> written = {3, 17, 40};
  std::vector<Bf16> latent = RandomBf16(rng_, written.size() * 512, 1.0f);
  const std::vector<Bf16> rope = RandomBf16(rng_, written.size() * 64, 1.0f);
  latent[512 + 300] = Bf16FromFloat(kNan);  // token 17, tile 2
  MlaCacheWriteParams w{.cache = arena.cache, .latent = latent.data(), .rope = rope.data(),
                        .slots = written.data(), .num_tokens = 3};
  ASSERT_TRUE(MlaCacheWriteRef(w).ok());
  ASSERT_EQ(arena.cache.LatentOfSlot(17)[300], kE4m3NanCode);
  DeviceBuffer d_arena = Up(arena.host);
  for (int heads : {16, 64, 128}) {
    const std::vector<int32_t> slots = {3, 40, -1, 17, 3, 40};  // row 1 chooses the NaN token
    const std::vector<Bf16> q = RandomBf16(rng_, size_t(2) * heads * 576, 0.1f);
    const DecodeShape shape{.batch = 2, .heads = heads};
    const MlaDecodeRun ref = Decode(Decoder::kReference, arena, d_arena, q, slots, shape);
    const MlaDecodeRun gpu = Decode(Decoder::kGpu, arena, d_arena, q, slots, shape);
    for (int h = 0; h < 2 * heads; ++h) {
      const bool nan_row = h >= heads;
      SCOPED_TRACE(::testing::Message() << heads << " heads, output row " << h);
      ASSERT_EQ(std::isnan(ref.lse[h]), nan_row) << "the reference";
      ASSERT_EQ(std::isnan(gpu.lse[h]), nan_row);
      for (int i = 0; i < 512; ++i) {
        ASSERT_EQ(std::isnan(Bf16ToFloat(gpu.out[size_t(h) * 512 + i])), nan_row) << "dim " << i;
      }
    }
  }
}

// Bytes no kvpool writer makes but a foreign one may: a tile whose scale is infinite and whose
// codes are finite. Its products are ±inf as in the reference, not NaN: with queries that make
// the token's score -inf it drops out of the softmax, so the log-sum-exp is the other token's
// and only the dims of that tile (0 · inf in P · V) are NaN, in the reference and in both kernels.
TEST_F(CudaMlaTest, SparseDecodeOfAnInfiniteTileScaleFollowsTheReference) {
  MlaArena arena(4, 16);
  const std::vector<Bf16> latent = RandomBf16(rng_, 512, 1.0f);
  const std::vector<Bf16> rope = RandomBf16(rng_, 64, 1.0f);
  const std::vector<int64_t> written = {5};
  MlaCacheWriteParams w{.cache = arena.cache, .latent = latent.data(), .rope = rope.data(),
                        .slots = written.data(), .num_tokens = 1};
  ASSERT_TRUE(MlaCacheWriteRef(w).ok());
  uint8_t* infinite = arena.cache.LatentOfSlot(9);
  std::memset(infinite, 0x38, 512);  // every code 1.0
  const float scales[4] = {1.0f, std::numeric_limits<float>::infinity(), 1.0f, 1.0f};
  std::memcpy(infinite + kMlaScalesOffset, scales, sizeof(scales));
  std::memset(infinite + kMlaRopeOffset, 0, 128);
  DeviceBuffer d_arena = Up(arena.host);
  for (int heads : {16, 64, 128}) {
    const std::vector<int32_t> slots = {5, 9};
    std::vector<Bf16> q(size_t(heads) * 576, Bf16FromFloat(0.0f));
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < 512; ++i) q[h * 576 + i] = Bf16FromFloat(i / 128 == 1 ? -0.01f : 0.02f);
    }
    const DecodeShape shape{.batch = 1, .heads = heads};
    const MlaDecodeRun ref = Decode(Decoder::kReference, arena, d_arena, q, slots, shape);
    const MlaDecodeRun gpu = Decode(Decoder::kGpu, arena, d_arena, q, slots, shape);
    for (int h = 0; h < heads; ++h) {
      SCOPED_TRACE(::testing::Message() << heads << " heads, head " << h);
      ASSERT_TRUE(std::isfinite(ref.lse[h])) << "the reference";
      ASSERT_NEAR(gpu.lse[h], ref.lse[h], 1e-2f * std::max(1.0f, std::fabs(ref.lse[h])));
      for (int i = 0; i < 512; ++i) {
        const bool nan = i / 128 == 1;
        ASSERT_EQ(std::isnan(Bf16ToFloat(ref.out[size_t(h) * 512 + i])), nan) << "dim " << i;
        ASSERT_EQ(std::isnan(Bf16ToFloat(gpu.out[size_t(h) * 512 + i])), nan) << "dim " << i;
      }
    }
  }
}

// 1,200 random tokens written into 1,920 slots (blocks of 48; the unused slots stay NaN bytes),
// on the device too, and how far bf16 rounding may move a decode over them from the reference.
struct WrittenArena {
  explicit WrittenArena(std::mt19937_64& rng) : arena(40, 48) {
    const size_t filled = 1200;
    written = DistinctSlots(rng, arena.slots(), filled);
    std::vector<Bf16> latent = RandomBf16(rng, filled * 512, 1.0f);
    std::vector<Bf16> rope = RandomBf16(rng, filled * 64, 1.0f);
    MlaCacheWriteParams w{.cache = arena.cache, .latent = latent.data(), .rope = rope.data(),
                          .slots = written.data(), .num_tokens = static_cast<int32_t>(filled)};
    EXPECT_TRUE(MlaCacheWriteRef(w).ok());
    d_arena = Up(arena.host);
    // The kernel rounds K to bf16 for the tensor cores (as FlashMLA does), so a score may be off
    // by 2^-9 · softmax_scale · Σ|q_i k_i| <= 2^-9 · softmax_scale · |q| · |k|: the lse by as
    // much. Rounding V (the latent) and the softmax weights to bf16 moves an output by up to
    // 2^-8 · Σ_t w_t |v_t| <= 2^-8 · max |v|.
    double v_max = 0;
    for (int64_t slot : written) {
      float token[576];
      DecodeMlaToken(arena.cache.LatentOfSlot(slot), token);
      double n2 = 0;
      for (float x : token) n2 += double(x) * x;
      k_norm = std::max(k_norm, std::sqrt(n2));
      for (int i = 0; i < 512; ++i) v_max = std::max(v_max, double(std::fabs(token[i])));
    }
    bf16_v = static_cast<float>(std::ldexp(v_max, -8));
  }

  // `rows` rows of `topk` slots of written tokens, every fifth -1, row 1 with none valid.
  std::vector<int32_t> Slots(std::mt19937_64& rng, int rows, int topk) const {
    std::vector<int32_t> slots(size_t(rows) * topk, -1);
    for (int r = 0; r < rows; ++r) {
      if (r == 1) continue;
      std::vector<int64_t> pick = written;
      std::shuffle(pick.begin(), pick.end(), rng);
      for (int k = 0; k < topk; ++k) {
        if (k % 5 != 3) slots[size_t(r) * topk + k] = static_cast<int32_t>(pick[k]);
      }
    }
    return slots;
  }

  // The GPU's decode of q against the reference's, within the bounds above (fatal failures
  // return from here: callers wrap it in ASSERT_NO_FATAL_FAILURE).
  void ExpectNearTheReference(const std::vector<Bf16>& q, const MlaDecodeRun& ref,
                              const MlaDecodeRun& gpu) const {
    for (size_t h = 0; h < ref.lse.size(); ++h) {
      if (std::isinf(ref.lse[h])) {
        ASSERT_EQ(gpu.lse[h], ref.lse[h]) << "head " << h;
      } else {
        double q_norm = 0;
        for (int i = 0; i < 576; ++i) {
          q_norm += double(Bf16ToFloat(q[h * 576 + i])) * Bf16ToFloat(q[h * 576 + i]);
        }
        const double bf16_k =
            std::ldexp(1.0, -9) * kDeepSeekV32SoftmaxScale * std::sqrt(q_norm) * k_norm;
        ASSERT_NEAR(gpu.lse[h], ref.lse[h],
                    1e-4f * std::max(1.0f, std::fabs(ref.lse[h])) + bf16_k)
            << "head " << h;
      }
      for (int i = 0; i < 512; ++i) {
        const float want = Bf16ToFloat(ref.out[h * 512 + i]);
        const float got = Bf16ToFloat(gpu.out[h * 512 + i]);
        // Float sums against double ones, both rounded to bf16 once (a bf16 step or two), and
        // the bf16 rounding of V and of the weights.
        ASSERT_NEAR(got, want, 1.6e-2f * std::fabs(want) + 2e-3f + bf16_v)
            << "head " << h << ", dim " << i;
      }
    }
  }

  MlaArena arena;
  std::vector<int64_t> written;
  DeviceBuffer d_arena;
  double k_norm = 0;
  float bf16_v = 0;
};

TEST_F(CudaMlaTest, SparseDecodeMatchesTheReference) {
  const WrittenArena w(rng_);
  // 48 and 80 heads: a row's heads in CTAs of 32 and 16 of the mma.sync kernel.
  for (int heads : {16, 32, 48, 64, 80, 128}) {
    for (int s_q : {1, 2}) {
      for (int topk : {1, 37, 512, 1100}) {  // one tile, a partial one, split across CTAs
        const DecodeShape shape{.batch = 3, .s_q = s_q, .heads = heads};
        const int rows = shape.batch * s_q;
        const std::vector<int32_t> slots = w.Slots(rng_, rows, topk);
        const std::vector<Bf16> q = RandomBf16(rng_, size_t(rows) * heads * 576, 0.15f);
        SCOPED_TRACE(::testing::Message() << heads << " heads, s_q " << s_q << ", top-" << topk);
        ASSERT_NO_FATAL_FAILURE(w.ExpectNearTheReference(
            q, Decode(Decoder::kReference, w.arena, w.d_arena, q, slots, shape),
            Decode(Decoder::kGpu, w.arena, w.d_arena, q, slots, shape)));
      }
    }
  }
  SparseMlaDecodeParams odd;
  odd.heads = 24;
  CudaWorkspace workspace;
  EXPECT_EQ(SparseMlaDecodeCuda(odd, workspace, nullptr).code(), absl::StatusCode::kUnimplemented)
      << "24 heads is not a multiple of 16";
}

// One row's top-k cut into 1 to 18 splits, each count merged by the combining kernel with its
// own number of split groups, in both kernels.
TEST_F(CudaMlaTest, SparseDecodeOfEverySplitCountMatchesTheReference) {
  const WrittenArena w(rng_);
  const int topk = 1100;  // 18 tiles
  for (int heads : {32, 128}) {
    const std::vector<int32_t> slots = w.Slots(rng_, 1, topk);
    const std::vector<Bf16> q = RandomBf16(rng_, size_t(heads) * 576, 0.15f);
    const MlaDecodeRun ref =
        Decode(Decoder::kReference, w.arena, w.d_arena, q, slots, {.heads = heads});
    for (int max_splits : {1, 2, 3, 4, 5, 7, 18}) {
      SCOPED_TRACE(::testing::Message() << heads << " heads, at most " << max_splits << " splits");
      ASSERT_NO_FATAL_FAILURE(w.ExpectNearTheReference(
          q, ref,
          Decode(Decoder::kGpu, w.arena, w.d_arena, q, slots,
                 {.heads = heads, .max_splits = max_splits})));
    }
  }
}

}  // namespace
}  // namespace kvp
