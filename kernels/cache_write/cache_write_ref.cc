#include "kernels/cache_write/cache_write_ref.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

void WidenRow(const Bf16* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace

absl::Status CacheWriteRef(const CacheWriteParams& p) {
  const LayerCache& c = p.cache;
  if (p.num_tokens > 0 && (p.k == nullptr || p.v == nullptr || p.slot_mapping == nullptr)) {
    return absl::InvalidArgumentError("cache write needs k, v and slot_mapping");
  }
  if (c.has_indexer && p.num_tokens > 0 && p.index_k == nullptr) {
    return absl::InvalidArgumentError("cache write into a pool with an indexer needs index_k");
  }
  const int64_t slots = c.num_blocks * c.block_size;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < -1 || slot >= slots) {
      return absl::OutOfRangeError(
          absl::StrCat("slot_mapping[", t, "] = ", slot, "; the arena has ", slots, " slots"));
    }
  }

  const int d = c.head_dim;
  std::vector<float> row(kMaxHeadDim);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / c.block_size;
    const int offset = static_cast<int>(slot % c.block_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const int64_t src = (t * c.num_kv_heads + h) * d;
      WidenRow(p.k + src, d, row.data());
      EncodeHead(c.k_codec, row.data(), d, c.K(block, offset, h), nullptr);
      WidenRow(p.v + src, d, row.data());
      EncodeHead(c.v_codec, row.data(), d, c.VData(block, offset, h), c.VScale(block, offset, h));
    }
    if (c.has_indexer) {
      WidenRow(p.index_k + t * kIndexHeadDim, kIndexHeadDim, row.data());
      EncodeHead(c.index_codec, row.data(), kIndexHeadDim, c.IndexValues(block, offset),
                 c.IndexScale(block, offset));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp
