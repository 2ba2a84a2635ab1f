#include "kernels/indexer_logits/indexer_logits_ref.h"

#include <array>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/host_dot.h"

namespace kvp {

absl::Status IndexerLogitsRef(const IndexerLogitsParams& p) {
  const LayerCache& c = p.cache;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (!c.has_indexer) {
    return absl::FailedPreconditionError("indexer logits over a pool without an indexer");
  }
  if (p.index_q == nullptr || p.head_weights == nullptr || p.block_tables == nullptr ||
      p.seq_lens == nullptr || p.logits == nullptr || p.num_heads <= 0) {
    return absl::InvalidArgumentError(
        "indexer logits need index_q, head_weights, block_tables, seq_lens, logits and heads > 0");
  }
  std::array<float, kIndexHeadDim> key;
  std::vector<float> q(static_cast<size_t>(p.num_heads) * kIndexHeadDim);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int32_t len = p.seq_lens[s];
    if (len < 0 || len > p.logits_stride || len > int64_t{p.block_table_stride} * c.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("seq_lens[", s, "] = ", len, " exceeds logits_stride or the block table"));
    }
    const int32_t* table = p.block_tables + int64_t{s} * p.block_table_stride;
    for (int64_t i = 0; i < int64_t{p.num_heads} * kIndexHeadDim; ++i) {
      q[i] = Bf16ToFloat(p.index_q[int64_t{s} * p.num_heads * kIndexHeadDim + i]);
    }
    float* row = p.logits + int64_t{s} * p.logits_stride;
    for (int32_t n = 0; n < len; ++n) {
      const int32_t block = table[n / c.block_size];
      if (!c.ValidBlock(block)) {
        return absl::OutOfRangeError(absl::StrCat("block table of sequence ", s, " names block ",
                                                  block, "; the arena has ", c.num_blocks));
      }
      const int slot = n % c.block_size;
      DecodeHead(c.index_codec, c.IndexValues(block, slot), c.IndexScale(block, slot),
                 kIndexHeadDim, key.data());
      double score = 0.0;
      for (int h = 0; h < p.num_heads; ++h) {
        const double dot = DotF64(&q[int64_t{h} * kIndexHeadDim], key.data(), kIndexHeadDim);
        if (dot > 0.0) score += double{p.head_weights[int64_t{s} * p.num_heads + h]} * dot;
      }
      row[n] = static_cast<float>(score);
    }
    for (int32_t n = len; n < p.logits_stride; ++n)
      row[n] = -std::numeric_limits<float>::infinity();
  }
  return absl::OkStatus();
}

}  // namespace kvp
