#include "kvpool/layout/block_layout.h"

#include <utility>

#include "base/status_macros.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/format/rotation.h"

namespace kvp {
namespace {

int64_t AlignUp(int64_t n, int64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

}  // namespace

absl::StatusOr<BlockLayout> BlockLayout::Create(const PoolSpec& spec) {
  RETURN_IF_ERROR(ValidatePoolSpec(spec));
  const int64_t token_heads = int64_t{spec.block_size} * spec.num_kv_heads;
  const FormatTraits k = TraitsOf(spec.k_format);
  const FormatTraits v = TraitsOf(spec.v_format);
  const FormatTraits idx = TraitsOf(KvFormat::kIndexer);
  const int64_t index_rows = spec.indexer ? spec.block_size : 0;

  std::vector<SectionOffsets> sections(spec.num_layers);
  int64_t cursor = 0;
  // Places a section of `bytes` at the next aligned offset and returns that offset.
  auto place = [&cursor](int64_t bytes) {
    const int64_t offset = AlignUp(cursor, kSectionAlignment);
    cursor = offset + bytes;
    return offset;
  };
  for (SectionOffsets& s : sections) {
    if (spec.mla()) {
      // The latent, then the indexer's sections; no K or V (sections of size 0 at the cursor).
      s.latent = place(int64_t{spec.block_size} * kMlaTokenBytes);
      s.k = s.v_data = s.v_scale = place(0);
      s.index_values = place(index_rows * idx.DataBytes(kIndexHeadDim));
      s.index_scales = place(index_rows * idx.ScaleBytes(kIndexHeadDim));
      s.end = cursor;
      continue;
    }
    s.latent = place(0);
    s.k = place(token_heads * k.DataBytes(spec.head_dim));
    s.v_data = place(token_heads * v.DataBytes(spec.head_dim));
    s.v_scale = place(token_heads * v.ScaleBytes(spec.head_dim));
    s.index_values = place(index_rows * idx.DataBytes(kIndexHeadDim));
    s.index_scales = place(index_rows * idx.ScaleBytes(kIndexHeadDim));
    s.end = cursor;
  }
  return BlockLayout(spec, std::move(sections), AlignUp(cursor, kBlockAlignment));
}

BlockLayout::BlockLayout(PoolSpec spec, std::vector<SectionOffsets> sections, int64_t block_stride)
    : spec_(std::move(spec)), sections_(std::move(sections)), block_stride_(block_stride) {}

LayerCache BlockLayout::Layer(uint8_t* base, int64_t num_blocks, int layer) const {
  LayerCache c;
  c.base = base;
  c.num_blocks = num_blocks;
  c.block_stride = block_stride_;
  c.sections = sections_[layer];
  c.block_size = spec_.block_size;
  c.num_kv_heads = spec_.num_kv_heads;
  c.head_dim = spec_.head_dim;
  c.has_indexer = spec_.indexer;
  // An MLA layer's K/V sections are empty and its codecs unused: nothing addresses them.
  if (!spec_.mla()) {
    c.k_head_bytes = static_cast<int32_t>(TraitsOf(spec_.k_format).DataBytes(spec_.head_dim));
    c.v_data_head_bytes =
        static_cast<int32_t>(TraitsOf(spec_.v_format).DataBytes(spec_.head_dim));
    c.v_scale_head_bytes =
        static_cast<int32_t>(TraitsOf(spec_.v_format).ScaleBytes(spec_.head_dim));
    c.k_codec.format = spec_.k_format;
    c.k_codec.scale = spec_.KScale(layer);
    c.v_codec.format = spec_.v_format;
    c.v_codec.scale = spec_.VScale(layer);
    c.v_codec.rotate = spec_.v_rotation;
    c.v_codec.signs = MakeRotationSigns(spec_.head_dim);
  }
  c.index_codec.format = KvFormat::kIndexer;
  c.index_codec.ue8m0 = spec_.indexer_ue8m0;
  return c;
}

}  // namespace kvp
