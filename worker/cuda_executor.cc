#include "worker/cuda_executor.h"

#include <algorithm>

#include "base/status_macros.h"
#include "kernels/common/cuda_status.h"
#include "kernels/synthetic/synthetic_model.h"
#include "kvpool/format/indexer_quant.h"
#include "kernels/block_copy/block_copy_ref.h"
#include "worker/job_inputs.h"
#include "worker/migration.h"

namespace kvp {

absl::StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(BlockLayout layout,
                                                                   uint8_t* base, JobContext ctx,
                                                                   int device) {
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream;
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<CudaExecutor>(
      new CudaExecutor(std::move(layout), base, std::move(ctx), stream));
}

CudaExecutor::CudaExecutor(BlockLayout layout, uint8_t* base, JobContext ctx, cudaStream_t stream)
    : layout_(std::move(layout)), base_(base), ctx_(std::move(ctx)), stream_(stream) {}

CudaExecutor::~CudaExecutor() {
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

template <typename T>
absl::StatusOr<T*> CudaExecutor::Upload(const std::vector<T>& host, CudaWorkspace& buffer) {
  const size_t bytes = std::max<size_t>(host.size() * sizeof(T), 1);
  ASSIGN_OR_RETURN(void* dev, buffer.Get(bytes));
  if (!host.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(T),
                                             cudaMemcpyHostToDevice, stream_));
  }
  return static_cast<T*>(dev);
}

SyntheticTokensParams CudaExecutor::SyntheticTokens(int layer, const int32_t* tokens, int64_t n,
                                                    void* k, void* v, void* index_k) const {
  SyntheticTokensParams p;
  p.config = SyntheticConfigOf(ctx_.model);
  p.layer = layer;
  p.num_kv_heads = ctx_.spec.num_kv_heads;
  p.head_dim = ctx_.spec.InputDim();
  p.tokens = tokens;
  p.num_tokens = n;
  p.k = static_cast<Bf16*>(k);
  p.v = static_cast<Bf16*>(v);
  p.index_k = static_cast<Bf16*>(index_k);
  return p;
}

absl::Status CudaExecutor::WriteTokens(const LayerCache& cache, const void* k, const void* v,
                                       const void* index_k, const int64_t* slots, int64_t n) {
  const Bf16* index = cache.has_indexer ? static_cast<const Bf16*>(index_k) : nullptr;
  if (ctx_.spec.mla()) {
    return MlaCacheWriteCuda(MlaRowsWrite(cache, static_cast<const Bf16*>(k), index, slots,
                                          static_cast<int32_t>(n)),
                             stream_);
  }
  return CacheWriteCuda(CacheWriteParams{.cache = cache,
                                         .k = static_cast<const Bf16*>(k),
                                         .v = static_cast<const Bf16*>(v),
                                         .index_k = index,
                                         .slot_mapping = slots,
                                         .num_tokens = n},
                        stream_);
}

absl::Status CudaExecutor::Copy(const std::vector<BlockCopyPair>& copies) {
  const int64_t stride = layout_.block_stride();
  for (const auto& [from, to] : copies) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base_ + to * stride, base_ + from * stride, stride,
                                             cudaMemcpyDeviceToDevice, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::MoveBlocksFrom(const uint8_t* source, int64_t source_blocks,
                                          const std::vector<BlockCopyPair>& moves) {
  std::vector<int32_t> from, to;
  for (const auto& [s, t] : moves) {
    from.push_back(s);
    to.push_back(t);
  }
  BlockMoveParams p{.source = source, .num_source_blocks = source_blocks, .target = base_,
                    .num_target_blocks = ctx_.num_blocks, .block_stride = layout_.block_stride(),
                    .source_ids = from.data(), .target_ids = to.data(),
                    .num_blocks = static_cast<int32_t>(moves.size())};
  RETURN_IF_ERROR(ValidateBlockMove(p));
  const std::vector<BlockRun> runs = CoalesceRuns(moves);
  if (runs.size() <= kMaxCopyEngineRuns) {
    const int64_t stride = p.block_stride;
    for (const BlockRun& run : runs) {
      KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base_ + run.target * stride,
                                               source + run.source * stride, run.count * stride,
                                               cudaMemcpyDeviceToDevice, stream_));
    }
  } else {
    ASSIGN_OR_RETURN(p.source_ids, Upload(from, move_from_));
    ASSIGN_OR_RETURN(p.target_ids, Upload(to, move_to_));
    RETURN_IF_ERROR(MoveBlocksCuda(p, stream_));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaExecutor::Prefill(const PrefillWork& work) {
  RETURN_IF_ERROR(Copy(work.copies));
  const int64_t n = static_cast<int64_t>(work.tokens.size());
  const size_t row = TokenRow(ctx_.spec);
  const bool indexer = ctx_.spec.indexer, values = !ctx_.spec.mla();
  ASSIGN_OR_RETURN(int64_t * slots, Upload(work.slots, slots_));
  ASSIGN_OR_RETURN(int32_t * tokens, Upload(work.tokens, tokens_));
  ASSIGN_OR_RETURN(void* k, k_.Get(n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* v, v_.Get(values ? n * row * sizeof(Bf16) : 1));
  ASSIGN_OR_RETURN(void* index_k, index_k_.Get(n * kIndexHeadDim * sizeof(Bf16)));
  TokenInputs host;
  for (int l = 0; l < ctx_.spec.num_layers; ++l) {
    if (work.activations.has_value()) {
      FillPrefillInputs(work, ctx_, l, &host);
      ASSIGN_OR_RETURN(k, Upload(host.k, k_));
      ASSIGN_OR_RETURN(v, Upload(host.v, v_));
      if (indexer) {
        ASSIGN_OR_RETURN(index_k, Upload(host.index_k, index_k_));
      }
    } else {
      SyntheticTokensParams p = SyntheticTokens(l, tokens, n, k, values ? v : nullptr,
                                                indexer ? index_k : nullptr);
      p.first_position = static_cast<int32_t>(work.first_position);
      RETURN_IF_ERROR(SyntheticTokensCuda(p, stream_));
    }
    RETURN_IF_ERROR(WriteTokens(layout_.Layer(base_, ctx_.num_blocks, l), k, v, index_k, slots, n));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

// A decode job's device arrays: the steps' (uploaded once), the layer's inputs (synthetic or
// uploaded, per layer) and the outputs of the layers returned.
struct CudaExecutor::DecodeBuffers {
  int n = 0;                      // steps
  DecodeBatch batch;              // block tables, lengths, slots as the kernels take them
  bool synthetic_tokens = true, synthetic_queries = true;
  SyntheticConfig synth;
  int32_t *tables = nullptr, *lens = nullptr, *tokens = nullptr, *positions = nullptr;
  int64_t* slots = nullptr;
  uint64_t* seeds = nullptr;
  int32_t *needle_pos = nullptr, *needle_tok = nullptr;
  float* needle_gain = nullptr;
  void *k = nullptr, *v = nullptr, *index_k = nullptr;              // the new tokens' [n, ...]
  void *q = nullptr, *index_q = nullptr, *weights = nullptr;        // the queries [n, ...]
  void* logits = nullptr;                                          // [n, max_len]
  int out_layers = 0;                                              // layers returned
  size_t out_per_layer = 0, topk_per_layer = 0;
  float* out = nullptr;                                  // [out_layers or 1, n, qh, d]; KV pools
  int32_t* topk = nullptr;                                         // [out_layers or 1, n, k]
  // MLA pools: the selected slots, and the decode's bf16 output (in place of `out`) and
  // log-sum-exp of each returned layer.
  int32_t* mla_slots = nullptr;                                    // [n, k]
  Bf16* mla_out = nullptr;                                         // [out_layers or 1, n, qh, d]
  float* lse = nullptr;                                            // [out_layers or 1, n, qh]
};

absl::StatusOr<CudaExecutor::DecodeBuffers> CudaExecutor::PrepareDecode(const DecodeWork& work) {
  DecodeBuffers b;
  b.n = static_cast<int>(work.steps.size());
  const int n = b.n, qh = ctx_.model.num_q_heads, d = ctx_.spec.head_dim;
  const bool mla = ctx_.spec.mla();
  b.synth = SyntheticConfigOf(ctx_.model);
  for (const DecodeStepWork& s : work.steps) {
    RETURN_IF_ERROR(Copy(s.copies));
    b.synthetic_tokens &= !s.activations.has_value();
    b.synthetic_queries &= !s.queries.has_value();
  }
  b.batch = DecodeBatchOf(work);
  std::vector<int32_t> tokens(n), positions(n), needle_pos(n, -1), needle_tok(n, 0);
  std::vector<uint64_t> seeds(n);
  std::vector<float> needle_gain(n, 0.0f);
  for (int i = 0; i < n; ++i) {
    const DecodeStepWork& s = work.steps[i];
    tokens[i] = s.token;
    positions[i] = static_cast<int32_t>(s.position);
    seeds[i] = SyntheticStepSeed(b.synth, s.token, s.position);
    if (s.needle.has_value()) {
      needle_pos[i] = s.needle->position;
      needle_tok[i] = s.needle->token;
      needle_gain[i] = s.needle->gain;
    }
  }
  ASSIGN_OR_RETURN(b.tables, Upload(b.batch.tables, tables_));
  ASSIGN_OR_RETURN(b.lens, Upload(b.batch.lens, lens_));
  ASSIGN_OR_RETURN(b.slots, Upload(b.batch.slots, slots_));
  ASSIGN_OR_RETURN(b.tokens, Upload(tokens, tokens_));
  ASSIGN_OR_RETURN(b.positions, Upload(positions, positions_));
  ASSIGN_OR_RETURN(b.seeds, Upload(seeds, seeds_));
  ASSIGN_OR_RETURN(b.needle_pos, Upload(needle_pos, needle_pos_));
  ASSIGN_OR_RETURN(b.needle_tok, Upload(needle_tok, needle_tok_));
  ASSIGN_OR_RETURN(b.needle_gain, Upload(needle_gain, needle_gain_));
  const size_t row = TokenRow(ctx_.spec);
  ASSIGN_OR_RETURN(b.k, k_.Get(n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(b.v, v_.Get(mla ? 1 : n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(b.index_k, index_k_.Get(n * kIndexHeadDim * sizeof(Bf16)));
  ASSIGN_OR_RETURN(b.q,
                   q_.Get(static_cast<size_t>(n) * qh * ctx_.spec.InputDim() * sizeof(Bf16)));
  ASSIGN_OR_RETURN(b.index_q, index_q_.Get(n * kIndexHeads * kIndexHeadDim * sizeof(Bf16)));
  ASSIGN_OR_RETURN(b.weights, weights_.Get(n * kIndexHeads * sizeof(float)));
  ASSIGN_OR_RETURN(b.logits,
                   logits_.Get(static_cast<size_t>(n) * b.batch.max_len * sizeof(float)));
  b.out_layers = work.outputs == wire::OutputLayers::ALL    ? ctx_.spec.num_layers
                 : work.outputs == wire::OutputLayers::LAST ? 1
                                                            : 0;
  b.out_per_layer = static_cast<size_t>(n) * qh * d;
  b.topk_per_layer = ctx_.spec.indexer ? static_cast<size_t>(n) * ctx_.model.topk : 0;
  const size_t layers = static_cast<size_t>(std::max(b.out_layers, 1));
  ASSIGN_OR_RETURN(void* topk, topk_.Get(std::max<size_t>(layers * b.topk_per_layer, 1) * 4));
  b.topk = static_cast<int32_t*>(topk);
  if (!mla) {
    ASSIGN_OR_RETURN(void* out, out_.Get(layers * b.out_per_layer * sizeof(float)));
    b.out = static_cast<float*>(out);
  } else {  // its outputs are bf16 (mla_out); no float ones on the device
    ASSIGN_OR_RETURN(void* slots, mla_slots_.Get(std::max<size_t>(b.topk_per_layer, 1) * 4));
    ASSIGN_OR_RETURN(void* mla_out, mla_out_.Get(layers * b.out_per_layer * sizeof(Bf16)));
    ASSIGN_OR_RETURN(void* lse, lse_.Get(layers * static_cast<size_t>(n) * qh * sizeof(float)));
    b.mla_slots = static_cast<int32_t*>(slots);
    b.mla_out = static_cast<Bf16*>(mla_out);
    b.lse = static_cast<float*>(lse);
  }
  return b;
}

absl::Status CudaExecutor::WriteDecodeTokens(const DecodeWork& work, int layer,
                                             const LayerCache& cache, DecodeBuffers& b) {
  const bool indexer = ctx_.spec.indexer;
  if (b.synthetic_tokens) {
    SyntheticTokensParams p = SyntheticTokens(layer, b.tokens, b.n, b.k,
                                              ctx_.spec.mla() ? nullptr : b.v,
                                              indexer ? b.index_k : nullptr);
    p.positions = b.positions;
    RETURN_IF_ERROR(SyntheticTokensCuda(p, stream_));
  } else {
    FillDecodeTokenInputs(work, ctx_, layer, &host_tokens_);
    ASSIGN_OR_RETURN(b.k, Upload(host_tokens_.k, k_));
    ASSIGN_OR_RETURN(b.v, Upload(host_tokens_.v, v_));
    if (indexer) {
      ASSIGN_OR_RETURN(b.index_k, Upload(host_tokens_.index_k, index_k_));
    }
  }
  return WriteTokens(cache, b.k, b.v, b.index_k, b.slots, b.n);
}

absl::Status CudaExecutor::FillDecodeQueries(const DecodeWork& work, int layer,
                                             DecodeBuffers& b) {
  const bool indexer = ctx_.spec.indexer;
  if (!b.synthetic_queries) {
    FillDecodeQueryInputs(work, ctx_, layer, &host_queries_);
    ASSIGN_OR_RETURN(b.q, Upload(host_queries_.q, q_));
    if (indexer) {
      ASSIGN_OR_RETURN(b.index_q, Upload(host_queries_.index_q, index_q_));
      ASSIGN_OR_RETURN(b.weights, Upload(host_queries_.weights, weights_));
    }
    return absl::OkStatus();
  }
  SyntheticQueriesParams p;
  p.config = b.synth;
  p.layer = layer;
  p.num_steps = b.n;
  p.num_q_heads = ctx_.model.num_q_heads;
  p.num_kv_heads = ctx_.spec.num_kv_heads;
  p.head_dim = ctx_.spec.InputDim();
  p.step_seeds = b.seeds;
  p.needle_positions = b.needle_pos;
  p.needle_tokens = b.needle_tok;
  p.needle_gains = b.needle_gain;
  p.q = static_cast<Bf16*>(b.q);
  p.index_q = indexer ? static_cast<Bf16*>(b.index_q) : nullptr;
  p.weights = indexer ? static_cast<float*>(b.weights) : nullptr;
  return SyntheticQueriesCuda(p, stream_);
}

absl::Status CudaExecutor::Attend(int layer, const LayerCache& cache, const DecodeBuffers& b,
                                  size_t out_slot) {
  // An MLA pool has no float outputs on the device (`out` is unused by its decode).
  float* out = b.out != nullptr ? b.out + out_slot * b.out_per_layer : nullptr;
  int32_t* topk = b.topk + out_slot * b.topk_per_layer;
  const int k = ctx_.model.topk;
  const AttentionParams attn{.cache = cache,
                             .q = static_cast<const Bf16*>(b.q),
                             .block_tables = b.tables,
                             .block_table_stride = b.batch.stride,
                             .seq_lens = b.lens,
                             .out = out,
                             .num_seqs = b.n,
                             .num_q_heads = ctx_.model.num_q_heads,
                             .softmax_scale = SoftmaxScaleOf(ctx_.model, ctx_.spec),
                             .sparse_v_threshold = ctx_.model.sparse_v_threshold,
                             .max_seq_len = b.batch.max_len,
                             .skipped_tiles = nullptr};
  if (!ctx_.spec.indexer) {
    return PagedDecodeCuda(PagedDecodeParams{.attn = attn, .window = ctx_.model.Window(layer)},
                           kernel_ws_, stream_);
  }
  float* logits = static_cast<float*>(b.logits);
  RETURN_IF_ERROR(IndexerLogitsCuda(
      IndexerLogitsParams{.cache = cache,
                          .index_q = static_cast<const Bf16*>(b.index_q),
                          .head_weights = static_cast<const float*>(b.weights),
                          .block_tables = b.tables,
                          .block_table_stride = b.batch.stride,
                          .seq_lens = b.lens,
                          .logits = logits,
                          .logits_stride = b.batch.max_len,
                          .num_seqs = b.n,
                          .num_heads = kIndexHeads},
      stream_));
  RETURN_IF_ERROR(TopkCuda(TopkParams{.scores = logits,
                                      .lengths = b.lens,
                                      .indices = topk,
                                      .scores_stride = b.batch.max_len,
                                      .num_rows = b.n,
                                      .k = k},
                           kernel_ws_, stream_));
  if (!ctx_.spec.mla()) {
    return SparseDecodeCuda(SparseDecodeParams{.attn = attn, .indices = topk, .topk = k},
                            kernel_ws_, stream_);
  }
  RETURN_IF_ERROR(SlotsOfPositionsCuda(SlotsOfPositionsParams{.positions = topk,
                                                              .block_tables = b.tables,
                                                              .block_table_stride = b.batch.stride,
                                                              .block_size = cache.block_size,
                                                              .slots = b.mla_slots,
                                                              .rows = b.n,
                                                              .k = k},
                                       stream_));
  const size_t heads = static_cast<size_t>(b.n) * ctx_.model.num_q_heads;
  return SparseMlaDecodeCuda(
      SparseMlaDecodeParams{.cache = cache,
                            .q = static_cast<const Bf16*>(b.q),
                            .slots = b.mla_slots,
                            .batch = b.n,
                            .s_q = 1,
                            .heads = ctx_.model.num_q_heads,
                            .topk = k,
                            .softmax_scale = SoftmaxScaleOf(ctx_.model, ctx_.spec),
                            .out = b.mla_out + out_slot * b.out_per_layer,
                            .lse = b.lse + out_slot * heads},
      kernel_ws_, stream_);
}

absl::StatusOr<std::vector<DecodeStepResult>> CudaExecutor::CollectOutputs(
    const DecodeWork& work, const DecodeBuffers& b) {
  const int qh = ctx_.model.num_q_heads, d = ctx_.spec.head_dim, k = ctx_.model.topk;
  const bool mla = ctx_.spec.mla();
  std::vector<float> host_out(b.out_layers * b.out_per_layer);
  std::vector<int32_t> host_topk(b.out_layers * b.topk_per_layer);
  std::vector<Bf16> host_mla_out(mla ? host_out.size() : 0);
  std::vector<float> host_lse(mla ? static_cast<size_t>(b.out_layers) * b.n * qh : 0);
  if (mla && !host_out.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_mla_out.data(), b.mla_out,
                                             host_mla_out.size() * sizeof(Bf16),
                                             cudaMemcpyDeviceToHost, stream_));
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_lse.data(), b.lse,
                                             host_lse.size() * sizeof(float),
                                             cudaMemcpyDeviceToHost, stream_));
  } else if (!host_out.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out.data(), b.out,
                                             host_out.size() * sizeof(float),
                                             cudaMemcpyDeviceToHost, stream_));
  }
  if (!host_topk.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_topk.data(), b.topk,
                                             host_topk.size() * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, stream_));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::transform(host_mla_out.begin(), host_mla_out.end(), host_out.begin(), Bf16ToFloat);
  std::vector<DecodeStepResult> results = EmptyResults(work);
  for (int i = 0; i < b.n; ++i) {
    for (int l = 0; l < b.out_layers; ++l) {
      const float* o = host_out.data() + l * b.out_per_layer + static_cast<size_t>(i) * qh * d;
      results[i].out.emplace_back(o, o + static_cast<size_t>(qh) * d);
      if (ctx_.spec.indexer) {
        const int32_t* t = host_topk.data() + l * b.topk_per_layer + static_cast<size_t>(i) * k;
        results[i].topk.emplace_back(t, t + k);
      }
      if (mla) {
        const float* e = host_lse.data() + (static_cast<size_t>(l) * b.n + i) * qh;
        results[i].lse.emplace_back(e, e + qh);
      }
    }
  }
  return results;
}

absl::StatusOr<std::vector<DecodeStepResult>> CudaExecutor::Decode(const DecodeWork& work) {
  ASSIGN_OR_RETURN(DecodeBuffers b, PrepareDecode(work));
  for (int l = 0; l < ctx_.spec.num_layers; ++l) {
    const LayerCache cache = layout_.Layer(base_, ctx_.num_blocks, l);
    RETURN_IF_ERROR(WriteDecodeTokens(work, l, cache, b));
    RETURN_IF_ERROR(FillDecodeQueries(work, l, b));
    // Unless all layers are returned, every layer writes the one output slot; the last one stays.
    const size_t slot = work.outputs == wire::OutputLayers::ALL ? static_cast<size_t>(l) : 0;
    RETURN_IF_ERROR(Attend(l, cache, b, slot));
  }
  return CollectOutputs(work, b);
}

}  // namespace kvp
