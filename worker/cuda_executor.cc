#include "worker/cuda_executor.h"

#include <algorithm>

#include "base/status_macros.h"
#include "kernels/common/cuda_status.h"
#include "kernels/synthetic/synthetic_model.h"
#include "kvpool/format/indexer_quant.h"
#include "worker/job_inputs.h"

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
  p.head_dim = ctx_.spec.head_dim;
  p.tokens = tokens;
  p.num_tokens = n;
  p.k = static_cast<Bf16*>(k);
  p.v = static_cast<Bf16*>(v);
  p.index_k = static_cast<Bf16*>(index_k);
  return p;
}

absl::Status CudaExecutor::Copy(const std::vector<BlockCopyPair>& copies) {
  const int64_t stride = layout_.block_stride();
  for (const auto& [from, to] : copies) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base_ + to * stride, base_ + from * stride, stride,
                                             cudaMemcpyDeviceToDevice, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::Prefill(const PrefillWork& work) {
  RETURN_IF_ERROR(Copy(work.copies));
  const int64_t n = static_cast<int64_t>(work.tokens.size());
  const size_t row = static_cast<size_t>(ctx_.spec.num_kv_heads) * ctx_.spec.head_dim;
  const bool indexer = ctx_.spec.indexer;
  ASSIGN_OR_RETURN(int64_t * slots, Upload(work.slots, slots_));
  ASSIGN_OR_RETURN(int32_t * tokens, Upload(work.tokens, tokens_));
  ASSIGN_OR_RETURN(void* k, k_.Get(n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* v, v_.Get(n * row * sizeof(Bf16)));
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
      SyntheticTokensParams p = SyntheticTokens(l, tokens, n, k, v, indexer ? index_k : nullptr);
      p.first_position = static_cast<int32_t>(work.first_position);
      RETURN_IF_ERROR(SyntheticTokensCuda(p, stream_));
    }
    RETURN_IF_ERROR(CacheWriteCuda(
        CacheWriteParams{layout_.Layer(base_, ctx_.num_blocks, l), static_cast<const Bf16*>(k),
                         static_cast<const Bf16*>(v),
                         indexer ? static_cast<const Bf16*>(index_k) : nullptr, slots, n},
        stream_));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DecodeStepResult>> CudaExecutor::Decode(const DecodeWork& work) {
  const int n = static_cast<int>(work.steps.size());
  const int qh = ctx_.model.num_q_heads, d = ctx_.spec.head_dim, k = ctx_.model.topk;
  const bool indexer = ctx_.spec.indexer;
  const SyntheticConfig synth = SyntheticConfigOf(ctx_.model);
  bool synthetic_tokens = true, synthetic_queries = true;
  for (const DecodeStepWork& s : work.steps) {
    RETURN_IF_ERROR(Copy(s.copies));
    synthetic_tokens &= !s.activations.has_value();
    synthetic_queries &= !s.queries.has_value();
  }
  const DecodeBatch batch = DecodeBatchOf(work);
  const int32_t stride = batch.stride, max_len = batch.max_len;
  std::vector<int32_t> tokens(n), positions(n), needle_pos(n, -1), needle_tok(n, 0);
  std::vector<uint64_t> seeds(n);
  std::vector<float> needle_gain(n, 0.0f);
  for (int i = 0; i < n; ++i) {
    const DecodeStepWork& s = work.steps[i];
    tokens[i] = s.token;
    positions[i] = static_cast<int32_t>(s.position);
    seeds[i] = SyntheticStepSeed(synth, s.token, s.position);
    if (s.needle.has_value()) {
      needle_pos[i] = s.needle->position;
      needle_tok[i] = s.needle->token;
      needle_gain[i] = s.needle->gain;
    }
  }
  ASSIGN_OR_RETURN(int32_t * d_tables, Upload(batch.tables, tables_));
  ASSIGN_OR_RETURN(int32_t * d_lens, Upload(batch.lens, lens_));
  ASSIGN_OR_RETURN(int64_t * d_slots, Upload(batch.slots, slots_));
  ASSIGN_OR_RETURN(int32_t * d_tokens, Upload(tokens, tokens_));
  ASSIGN_OR_RETURN(int32_t * d_positions, Upload(positions, positions_));
  ASSIGN_OR_RETURN(uint64_t * d_seeds, Upload(seeds, seeds_));
  ASSIGN_OR_RETURN(int32_t * d_needle_pos, Upload(needle_pos, needle_pos_));
  ASSIGN_OR_RETURN(int32_t * d_needle_tok, Upload(needle_tok, needle_tok_));
  ASSIGN_OR_RETURN(float* d_needle_gain, Upload(needle_gain, needle_gain_));

  const size_t row = static_cast<size_t>(ctx_.spec.num_kv_heads) * d;
  ASSIGN_OR_RETURN(void* kv_k, k_.Get(n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* kv_v, v_.Get(n * row * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* idx_k, index_k_.Get(n * kIndexHeadDim * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* q, q_.Get(static_cast<size_t>(n) * qh * d * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* idx_q, index_q_.Get(n * kIndexHeads * kIndexHeadDim * sizeof(Bf16)));
  ASSIGN_OR_RETURN(void* weights, weights_.Get(n * kIndexHeads * sizeof(float)));
  ASSIGN_OR_RETURN(void* logits, logits_.Get(static_cast<size_t>(n) * max_len * sizeof(float)));
  const int out_layers = work.outputs == wire::OutputLayers::ALL    ? ctx_.spec.num_layers
                         : work.outputs == wire::OutputLayers::LAST ? 1
                                                                    : 0;
  const size_t out_per_layer = static_cast<size_t>(n) * qh * d;
  const size_t topk_per_layer = indexer ? static_cast<size_t>(n) * k : 0;
  ASSIGN_OR_RETURN(void* out, out_.Get(std::max(out_layers, 1) * out_per_layer * sizeof(float)));
  ASSIGN_OR_RETURN(void* topk,
                   topk_.Get(std::max<size_t>(std::max(out_layers, 1) * topk_per_layer, 1) * 4));

  TokenInputs host_tokens;
  QueryInputs host_queries;
  for (int l = 0; l < ctx_.spec.num_layers; ++l) {
    const LayerCache cache = layout_.Layer(base_, ctx_.num_blocks, l);
    if (synthetic_tokens) {
      SyntheticTokensParams p =
          SyntheticTokens(l, d_tokens, n, kv_k, kv_v, indexer ? idx_k : nullptr);
      p.positions = d_positions;
      RETURN_IF_ERROR(SyntheticTokensCuda(p, stream_));
    } else {
      FillDecodeTokenInputs(work, ctx_, l, &host_tokens);
      ASSIGN_OR_RETURN(kv_k, Upload(host_tokens.k, k_));
      ASSIGN_OR_RETURN(kv_v, Upload(host_tokens.v, v_));
      if (indexer) {
        ASSIGN_OR_RETURN(idx_k, Upload(host_tokens.index_k, index_k_));
      }
    }
    RETURN_IF_ERROR(CacheWriteCuda(
        CacheWriteParams{cache, static_cast<const Bf16*>(kv_k), static_cast<const Bf16*>(kv_v),
                         indexer ? static_cast<const Bf16*>(idx_k) : nullptr, d_slots, n},
        stream_));
    if (synthetic_queries) {
      SyntheticQueriesParams p;
      p.config = synth;
      p.layer = l;
      p.num_steps = n;
      p.num_q_heads = qh;
      p.num_kv_heads = ctx_.spec.num_kv_heads;
      p.head_dim = d;
      p.step_seeds = d_seeds;
      p.needle_positions = d_needle_pos;
      p.needle_tokens = d_needle_tok;
      p.needle_gains = d_needle_gain;
      p.q = static_cast<Bf16*>(q);
      p.index_q = indexer ? static_cast<Bf16*>(idx_q) : nullptr;
      p.weights = indexer ? static_cast<float*>(weights) : nullptr;
      RETURN_IF_ERROR(SyntheticQueriesCuda(p, stream_));
    } else {
      FillDecodeQueryInputs(work, ctx_, l, &host_queries);
      ASSIGN_OR_RETURN(q, Upload(host_queries.q, q_));
      if (indexer) {
        ASSIGN_OR_RETURN(idx_q, Upload(host_queries.index_q, index_q_));
        ASSIGN_OR_RETURN(weights, Upload(host_queries.weights, weights_));
      }
    }
    // Unless all layers are returned, every layer writes the one output slot; the last one stays.
    const int slot = work.outputs == wire::OutputLayers::ALL ? l : 0;
    float* layer_out = static_cast<float*>(out) + slot * out_per_layer;
    int32_t* layer_topk = static_cast<int32_t*>(topk) + slot * topk_per_layer;
    const AttentionParams attn{.cache = cache,
                               .q = static_cast<const Bf16*>(q),
                               .block_tables = d_tables,
                               .block_table_stride = stride,
                               .seq_lens = d_lens,
                               .out = layer_out,
                               .num_seqs = n,
                               .num_q_heads = qh,
                               .softmax_scale = DefaultSoftmaxScale(d),
                               .sparse_v_threshold = ctx_.model.sparse_v_threshold,
                               .max_seq_len = max_len,
                               .skipped_tiles = nullptr};
    if (indexer) {
      RETURN_IF_ERROR(IndexerLogitsCuda(
          IndexerLogitsParams{cache, static_cast<const Bf16*>(idx_q),
                              static_cast<const float*>(weights), d_tables, stride, d_lens,
                              static_cast<float*>(logits), max_len, n, kIndexHeads},
          stream_));
      RETURN_IF_ERROR(
          TopkCuda(TopkParams{static_cast<const float*>(logits), d_lens, layer_topk, max_len, n, k},
                   kernel_ws_, stream_));
      RETURN_IF_ERROR(
          SparseDecodeCuda(SparseDecodeParams{attn, layer_topk, k}, kernel_ws_, stream_));
    } else {
      RETURN_IF_ERROR(
          PagedDecodeCuda(PagedDecodeParams{attn, ctx_.model.Window(l)}, kernel_ws_, stream_));
    }
  }
  std::vector<float> host_out(out_layers * out_per_layer);
  std::vector<int32_t> host_topk(out_layers * topk_per_layer);
  if (!host_out.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out.data(), out, host_out.size() * sizeof(float),
                                             cudaMemcpyDeviceToHost, stream_));
  }
  if (!host_topk.empty()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_topk.data(), topk,
                                             host_topk.size() * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, stream_));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  std::vector<DecodeStepResult> results = EmptyResults(work);
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l < out_layers; ++l) {
      const float* o = host_out.data() + l * out_per_layer + static_cast<size_t>(i) * qh * d;
      results[i].out.emplace_back(o, o + static_cast<size_t>(qh) * d);
      if (indexer) {
        const int32_t* t = host_topk.data() + l * topk_per_layer + static_cast<size_t>(i) * k;
        results[i].topk.emplace_back(t, t + k);
      }
    }
  }
  return results;
}

}  // namespace kvp
