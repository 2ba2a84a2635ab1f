#include "kernels/mla/mla_ref.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

absl::Status CheckSlot(const LayerCache& cache, int64_t slot, const char* what, int64_t i) {
  const int64_t slots = cache.num_blocks * cache.block_size;
  if (slot < -1 || slot >= slots) {
    return absl::OutOfRangeError(absl::StrCat(what, "[", i, "] = ", slot, "; the arena has ",
                                              slots, " slots"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MlaCacheWriteRef(const MlaCacheWriteParams& p) {
  if (p.num_tokens < 0) return absl::InvalidArgumentError("a negative token count");
  if (p.cache.has_indexer && p.num_tokens > 0 && p.index_k == nullptr) {
    return absl::InvalidArgumentError("an MLA cache write into a layer with an indexer needs index_k");
  }
  float token[kMlaInputDim];
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slots[t];
    if (absl::Status s = CheckSlot(p.cache, slot, "slots", t); !s.ok()) return s;
    if (slot < 0) continue;
    for (int i = 0; i < kMlaLatentDim; ++i) {
      token[i] = Bf16ToFloat(p.latent[int64_t{t} * p.latent_stride + i]);
    }
    for (int i = 0; i < kMlaRopeDim; ++i) {
      token[kMlaLatentDim + i] = Bf16ToFloat(p.rope[int64_t{t} * p.rope_stride + i]);
    }
    EncodeMlaToken(token, p.cache.LatentOfSlot(slot));
    if (!p.cache.has_indexer) continue;
    const int64_t block = slot / p.cache.block_size;
    const int offset = static_cast<int>(slot % p.cache.block_size);
    for (int i = 0; i < kIndexHeadDim; ++i) {
      token[i] = Bf16ToFloat(p.index_k[int64_t{t} * kIndexHeadDim + i]);
    }
    EncodeHead(p.cache.index_codec, token, kIndexHeadDim, p.cache.IndexValues(block, offset),
               p.cache.IndexScale(block, offset));
  }
  return absl::OkStatus();
}

absl::Status SlotsOfPositionsRef(const SlotsOfPositionsParams& p) {
  for (int64_t row = 0; row < p.rows; ++row) {
    const int32_t* table = p.block_tables + row * p.block_table_stride;
    for (int64_t i = 0; i < p.k; ++i) {
      const int32_t pos = p.positions[row * p.k + i];
      if (pos >= int64_t{p.block_table_stride} * p.block_size) {
        return absl::OutOfRangeError(absl::StrCat("position ", pos, " of row ", row,
                                                  " is past its block table"));
      }
      p.slots[row * p.k + i] =
          pos < 0 ? -1 : static_cast<int32_t>(SlotOfPosition(table, pos, p.block_size));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseMlaDecodeRef(const SparseMlaDecodeParams& p) {
  if (p.batch < 0 || p.s_q < 1 || p.heads < 1 || p.topk < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sparse MLA decode of batch ", p.batch, ", s_q ",
                                                   p.s_q, ", ", p.heads, " heads, top-", p.topk));
  }
  std::vector<std::vector<float>> tokens;  // the valid slots of one row, dequantized
  std::vector<double> scores;
  for (int64_t row = 0; row < int64_t{p.batch} * p.s_q; ++row) {
    const int32_t* slots = p.slots + row * p.topk;
    absl::flat_hash_set<int32_t> seen;
    tokens.clear();
    for (int i = 0; i < p.topk; ++i) {
      if (absl::Status s = CheckSlot(p.cache, slots[i], "slots", row * p.topk + i); !s.ok()) {
        return s;
      }
      if (slots[i] < 0) continue;
      if (!seen.insert(slots[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("slots row ", row, " names slot ", slots[i], " twice"));
      }
      std::vector<float>& t = tokens.emplace_back(kMlaInputDim);
      DecodeMlaToken(p.cache.LatentOfSlot(slots[i]), t.data());
    }
    for (int h = 0; h < p.heads; ++h) {
      const int64_t head = row * p.heads + h;
      const Bf16* q = p.q + head * kMlaInputDim;
      Bf16* out = p.out + head * kMlaLatentDim;
      if (tokens.empty()) {
        for (int d = 0; d < kMlaLatentDim; ++d) out[d] = Bf16FromFloat(0.0f);
        p.lse[head] = -std::numeric_limits<float>::infinity();
        continue;
      }
      scores.assign(tokens.size(), 0.0);
      double max_score = -std::numeric_limits<double>::infinity();
      for (size_t t = 0; t < tokens.size(); ++t) {
        double dot = 0.0;
        for (int d = 0; d < kMlaInputDim; ++d) dot += double{Bf16ToFloat(q[d])} * tokens[t][d];
        scores[t] = double{p.softmax_scale} * dot;
        max_score = std::max(max_score, scores[t]);
      }
      double sum = 0.0;
      std::vector<double> acc(kMlaLatentDim, 0.0);
      for (size_t t = 0; t < tokens.size(); ++t) {
        const double w = std::exp(scores[t] - max_score);
        sum += w;
        for (int d = 0; d < kMlaLatentDim; ++d) acc[d] += w * tokens[t][d];
      }
      for (int d = 0; d < kMlaLatentDim; ++d) {
        out[d] = Bf16FromFloat(static_cast<float>(acc[d] / sum));
      }
      p.lse[head] = static_cast<float>(max_score + std::log(sum));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp
