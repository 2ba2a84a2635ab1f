#include "kvpool/layout/block_layout.h"

#include <vector>

#include "gtest/gtest.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

PoolSpec Spec(int layers, int heads, int d, int block, KvFormat k, KvFormat v, bool indexer) {
  PoolSpec s;
  s.num_layers = layers;
  s.num_kv_heads = heads;
  s.head_dim = d;
  s.block_size = block;
  s.k_format = k;
  s.v_format = v;
  s.indexer = indexer;
  return s;
}

TEST(BlockLayoutTest, SectionSizesOfADeepSeekLikeLayer) {
  const BlockLayout layout =
      BlockLayout::Create(Spec(2, 8, 128, 64, KvFormat::kFp8E4m3, KvFormat::kTurbo3, true)).value();
  const SectionOffsets& l0 = layout.sections(0);
  EXPECT_EQ(l0.k, 0);
  EXPECT_EQ(l0.v_data, 64 * 8 * 128);                      // fp8 K
  EXPECT_EQ(l0.v_scale, l0.v_data + 64 * 8 * 48);          // turbo3 data: 48 bytes per head
  EXPECT_EQ(l0.index_values, l0.v_scale + 64 * 8 * 8);     // one scale per 16
  EXPECT_EQ(l0.index_scales, l0.index_values + 64 * 128);  // values, then scales
  EXPECT_EQ(l0.end, l0.index_scales + 64 * 4);
  EXPECT_EQ(layout.sections(1).k, l0.end);
  EXPECT_EQ(layout.block_stride(), (2 * l0.end + 255) / 256 * 256);
}

TEST(BlockLayoutTest, AnMlaLayerIsItsLatentsThenTheIndexer) {
  const BlockLayout layout = BlockLayout::Create(MlaPoolSpec(3, 64, true)).value();
  const SectionOffsets& l0 = layout.sections(0);
  EXPECT_EQ(l0.latent, 0);
  EXPECT_EQ(l0.k, 64 * kMlaTokenBytes);  // K and V: empty, at the cursor
  EXPECT_EQ(l0.v_data, l0.k);
  EXPECT_EQ(l0.v_scale, l0.k);
  EXPECT_EQ(l0.index_values, l0.k);
  EXPECT_EQ(l0.index_scales, l0.index_values + 64 * 128);
  EXPECT_EQ(l0.end, l0.index_scales + 64 * 4);
  EXPECT_EQ(layout.sections(1).latent, l0.end);
  EXPECT_EQ(layout.block_stride(), (3 * l0.end + 255) / 256 * 256);
  // 656 + 132 bytes a token and layer: DeepSeek-V3.2's cache, a block contiguous across layers.
  EXPECT_EQ(l0.end, 64 * (656 + 132));
  std::vector<uint8_t> arena(2 * layout.block_stride());
  const LayerCache c = layout.Layer(arena.data(), 2, 2);
  EXPECT_EQ(c.Latent(1, 3) - arena.data(),
            layout.block_stride() + layout.sections(2).latent + 3 * kMlaTokenBytes);
  EXPECT_EQ(c.LatentOfSlot(64 + 3), c.Latent(1, 3));
  EXPECT_EQ(c.k_head_bytes, 0);
}

TEST(BlockLayoutTest, AnMlaPoolHasOneShape) {
  EXPECT_TRUE(ValidatePoolSpec(MlaPoolSpec(61, 64, true)).ok());
  EXPECT_TRUE(ValidatePoolSpec(MlaPoolSpec(61, 16, false)).ok());
  PoolSpec spec = MlaPoolSpec(4, 64, true);
  spec.num_kv_heads = 8;
  EXPECT_EQ(ValidatePoolSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = MlaPoolSpec(4, 64, true);
  spec.indexer = false;
  EXPECT_EQ(ValidatePoolSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = MlaPoolSpec(4, 64, true);
  spec.k_scales = {1, 1, 1, 1};
  EXPECT_EQ(ValidatePoolSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePoolSpec(MlaPoolSpec(4, 48, true)).code(), absl::StatusCode::kInvalidArgument);
  spec = PoolSpec();
  spec.kind = static_cast<PoolKind>(7);
  EXPECT_EQ(ValidatePoolSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MlaPoolSpec(4, 64, true).InputDim(), 576);
  EXPECT_EQ(PoolSpec().InputDim(), 128);
  EXPECT_EQ(ParsePoolKind("mla").value(), PoolKind::kMla);
  EXPECT_EQ(ParsePoolKind("kv").value(), PoolKind::kKv);
  EXPECT_EQ(ParsePoolKind("gqa").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockLayoutTest, SectionsAreOrderedAlignedAndNeverOverlapForEverySpec) {
  const KvFormat ks[] = {KvFormat::kBf16, KvFormat::kFp8E4m3};
  const KvFormat vs[] = {KvFormat::kBf16, KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4};
  int specs = 0;
  for (int layers : {1, 3}) {
    for (int heads : {1, 3, 8}) {
      for (int d : {64, 128, 256}) {
        for (int block : {16, 32, 64}) {
          for (KvFormat k : ks) {
            for (KvFormat v : vs) {
              for (bool indexer : {false, true}) {
                const PoolSpec spec = Spec(layers, heads, d, block, k, v, indexer);
                const BlockLayout layout = BlockLayout::Create(spec).value();
                const int64_t tokens = int64_t{block} * heads;
                int64_t cursor = 0;
                for (int l = 0; l < layers; ++l) {
                  const SectionOffsets& s = layout.sections(l);
                  const int64_t starts[] = {s.k, s.v_data, s.v_scale, s.index_values,
                                            s.index_scales};
                  const int64_t sizes[] = {tokens * TraitsOf(k).DataBytes(d),
                                           tokens * TraitsOf(v).DataBytes(d),
                                           tokens * TraitsOf(v).ScaleBytes(d),
                                           indexer ? block * 128 : 0, indexer ? block * 4 : 0};
                  for (int i = 0; i < 5; ++i) {
                    EXPECT_EQ(starts[i] % 16, 0);
                    EXPECT_GE(starts[i], cursor) << spec.DebugString() << " section " << i;
                    cursor = starts[i] + sizes[i];
                  }
                  EXPECT_EQ(s.end, cursor);
                }
                EXPECT_EQ(layout.block_stride() % 256, 0);
                EXPECT_GE(layout.block_stride(), cursor);
                EXPECT_LT(layout.block_stride() - cursor, 256 + 16);
                ++specs;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(specs, 2 * 3 * 3 * 3 * 2 * 4 * 2);
}

TEST(BlockLayoutTest, LayerViewAddressesRowsTokenMajorThenHead) {
  PoolSpec spec = Spec(2, 4, 64, 16, KvFormat::kFp8E4m3, KvFormat::kTurbo4, true);
  spec.k_scales = {0.5f, 2.0f};
  const BlockLayout layout = BlockLayout::Create(spec).value();
  std::vector<uint8_t> arena(3 * layout.block_stride());
  const LayerCache c = layout.Layer(arena.data(), 3, 1);
  const int64_t block = 2 * layout.block_stride();
  const SectionOffsets& s = layout.sections(1);
  EXPECT_EQ(c.K(2, 5, 3) - arena.data(), block + s.k + (5 * 4 + 3) * 64);
  EXPECT_EQ(c.VData(2, 5, 3) - arena.data(), block + s.v_data + (5 * 4 + 3) * 32);
  EXPECT_EQ(c.VScale(2, 5, 3) - arena.data(), block + s.v_scale + (5 * 4 + 3) * 4);
  EXPECT_EQ(c.IndexValues(2, 5) - arena.data(), block + s.index_values + 5 * 128);
  EXPECT_EQ(c.IndexScale(2, 5) - arena.data(), block + s.index_scales + 5 * 4);
  EXPECT_EQ(c.k_codec.scale, 2.0f);
  EXPECT_TRUE(c.ValidBlock(2));
  EXPECT_FALSE(c.ValidBlock(3));
}

TEST(BlockLayoutTest, RejectsSpecsNoKernelCanServe) {
  PoolSpec spec;
  spec.head_dim = 96;
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec = PoolSpec();
  spec.block_size = 48;
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec = PoolSpec();
  spec.k_format = KvFormat::kTurbo3;
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kUnimplemented);
  spec = PoolSpec();
  spec.v_format = KvFormat::kFp8E4m3;
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kUnimplemented);
  spec = PoolSpec();
  spec.num_layers = 2;
  spec.v_scales = {1.0f};
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.v_scales = {1.0f, -1.0f};
  EXPECT_EQ(BlockLayout::Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp
