#include "worker/host_executor.h"

#include <algorithm>
#include <cstring>

#include "base/status_macros.h"
#include "kernels/block_copy/block_copy_ref.h"
#include "kernels/cache_write/cache_write_ref.h"
#include "kernels/indexer_logits/indexer_logits_ref.h"
#include "kernels/mla/mla_ref.h"
#include "kernels/paged_decode/paged_decode_ref.h"
#include "kernels/sparse_decode/sparse_decode_ref.h"
#include "kernels/topk/topk_ref.h"
#include "worker/job_inputs.h"
#include "worker/migration.h"

namespace kvp {

namespace {

// Layer `cache`'s new tokens written into their slots: K/V (and index keys), or MLA latents.
absl::Status WriteTokens(const LayerCache& cache, bool mla, const TokenInputs& in,
                         const int64_t* slots, int64_t n) {
  if (n == 0) return absl::OkStatus();  // and in.k may be empty: no row pointers into it
  const Bf16* index_k = cache.has_indexer ? in.index_k.data() : nullptr;
  if (mla) {
    return MlaCacheWriteRef(
        MlaRowsWrite(cache, in.k.data(), index_k, slots, static_cast<int32_t>(n)));
  }
  return CacheWriteRef(CacheWriteParams{.cache = cache,
                                        .k = in.k.data(),
                                        .v = in.v.data(),
                                        .index_k = index_k,
                                        .slot_mapping = slots,
                                        .num_tokens = n});
}

}  // namespace

HostExecutor::HostExecutor(BlockLayout layout, uint8_t* base, JobContext ctx)
    : layout_(std::move(layout)), base_(base), ctx_(std::move(ctx)) {}

void HostExecutor::Copy(const std::vector<BlockCopyPair>& copies) {
  const int64_t stride = layout_.block_stride();
  for (const auto& [from, to] : copies) {
    std::memcpy(base_ + to * stride, base_ + from * stride, stride);
  }
}

absl::Status HostExecutor::MoveBlocksFrom(const uint8_t* source, int64_t source_blocks,
                                          const std::vector<BlockCopyPair>& moves) {
  std::vector<int32_t> from, to;
  for (const auto& [s, t] : moves) {
    from.push_back(s);
    to.push_back(t);
  }
  const int64_t stride = layout_.block_stride();
  RETURN_IF_ERROR(ValidateBlockMove({.source = source, .num_source_blocks = source_blocks,
                                     .target = base_, .num_target_blocks = ctx_.num_blocks,
                                     .block_stride = stride, .source_ids = from.data(),
                                     .target_ids = to.data(),
                                     .num_blocks = static_cast<int32_t>(moves.size())}));
  for (const BlockRun& run : CoalesceRuns(moves)) {
    std::memcpy(base_ + run.target * stride, source + run.source * stride, run.count * stride);
  }
  return absl::OkStatus();
}

absl::Status HostExecutor::Prefill(const PrefillWork& work) {
  Copy(work.copies);
  TokenInputs in;
  for (int l = 0; l < ctx_.spec.num_layers; ++l) {
    FillPrefillInputs(work, ctx_, l, &in);
    RETURN_IF_ERROR(WriteTokens(layout_.Layer(base_, ctx_.num_blocks, l), ctx_.spec.mla(), in,
                                work.slots.data(), static_cast<int64_t>(work.tokens.size())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DecodeStepResult>> HostExecutor::Decode(const DecodeWork& work) {
  const int n = static_cast<int>(work.steps.size());
  const int qh = ctx_.model.num_q_heads, d = ctx_.spec.head_dim;
  for (const DecodeStepWork& s : work.steps) Copy(s.copies);
  const DecodeBatch batch = DecodeBatchOf(work);
  const int32_t stride = batch.stride, max_len = batch.max_len;
  const int32_t* tables = batch.tables.data();
  const int32_t* lens = batch.lens.data();
  std::vector<DecodeStepResult> results = EmptyResults(work);
  const int k = ctx_.model.topk;
  TokenInputs tokens;
  QueryInputs queries;
  std::vector<float> out(static_cast<size_t>(n) * qh * d), logits;
  std::vector<int32_t> indices(static_cast<size_t>(n) * k);
  // MLA pools: the selected slots, the decode's bf16 output and each head's log-sum-exp.
  const bool mla = ctx_.spec.mla();
  std::vector<int32_t> mla_slots(mla ? indices.size() : 0);
  std::vector<Bf16> mla_out(mla ? out.size() : 0);
  std::vector<float> lse(mla ? static_cast<size_t>(n) * qh : 0);
  for (int l = 0; l < ctx_.spec.num_layers; ++l) {
    const LayerCache cache = layout_.Layer(base_, ctx_.num_blocks, l);
    FillDecodeTokenInputs(work, ctx_, l, &tokens);
    RETURN_IF_ERROR(WriteTokens(cache, mla, tokens, batch.slots.data(), n));
    FillDecodeQueryInputs(work, ctx_, l, &queries);
    const AttentionParams attn{.cache = cache,
                               .q = queries.q.data(),
                               .block_tables = tables,
                               .block_table_stride = stride,
                               .seq_lens = lens,
                               .out = out.data(),
                               .num_seqs = n,
                               .num_q_heads = qh,
                               .softmax_scale = SoftmaxScaleOf(ctx_.model, ctx_.spec),
                               .sparse_v_threshold = ctx_.model.sparse_v_threshold,
                               .max_seq_len = max_len,
                               .skipped_tiles = nullptr};
    if (ctx_.spec.indexer) {
      logits.resize(static_cast<size_t>(n) * max_len);
      RETURN_IF_ERROR(IndexerLogitsRef(IndexerLogitsParams{.cache = cache,
                                                           .index_q = queries.index_q.data(),
                                                           .head_weights = queries.weights.data(),
                                                           .block_tables = tables,
                                                           .block_table_stride = stride,
                                                           .seq_lens = lens,
                                                           .logits = logits.data(),
                                                           .logits_stride = max_len,
                                                           .num_seqs = n,
                                                           .num_heads = kIndexHeads}));
      RETURN_IF_ERROR(TopkRef(TopkParams{.scores = logits.data(),
                                         .lengths = lens,
                                         .indices = indices.data(),
                                         .scores_stride = max_len,
                                         .num_rows = n,
                                         .k = k}));
      if (mla) {
        RETURN_IF_ERROR(SlotsOfPositionsRef(SlotsOfPositionsParams{.positions = indices.data(),
                                                                   .block_tables = tables,
                                                                   .block_table_stride = stride,
                                                                   .block_size = cache.block_size,
                                                                   .slots = mla_slots.data(),
                                                                   .rows = n,
                                                                   .k = k}));
        RETURN_IF_ERROR(SparseMlaDecodeRef(
            SparseMlaDecodeParams{.cache = cache,
                                  .q = queries.q.data(),
                                  .slots = mla_slots.data(),
                                  .batch = n,
                                  .s_q = 1,
                                  .heads = qh,
                                  .topk = k,
                                  .softmax_scale = SoftmaxScaleOf(ctx_.model, ctx_.spec),
                                  .out = mla_out.data(),
                                  .lse = lse.data()}));
        std::transform(mla_out.begin(), mla_out.end(), out.begin(), Bf16ToFloat);
      } else {
        RETURN_IF_ERROR(SparseDecodeRef(
            SparseDecodeParams{.attn = attn, .indices = indices.data(), .topk = k}));
      }
    } else {
      RETURN_IF_ERROR(
          PagedDecodeRef(PagedDecodeParams{.attn = attn, .window = ctx_.model.Window(l)}));
    }
    const bool returned =
        work.outputs == wire::OutputLayers::ALL ||
        (work.outputs == wire::OutputLayers::LAST && l + 1 == ctx_.spec.num_layers);
    if (!returned) continue;
    for (int i = 0; i < n; ++i) {
      results[i].out.emplace_back(out.begin() + static_cast<size_t>(i) * qh * d,
                                  out.begin() + static_cast<size_t>(i + 1) * qh * d);
      if (ctx_.spec.indexer) {
        results[i].topk.emplace_back(indices.begin() + static_cast<size_t>(i) * k,
                                     indices.begin() + static_cast<size_t>(i + 1) * k);
      }
      if (mla) {
        results[i].lse.emplace_back(lse.begin() + static_cast<size_t>(i) * qh,
                                    lse.begin() + static_cast<size_t>(i + 1) * qh);
      }
    }
  }
  return results;
}

}  // namespace kvp
