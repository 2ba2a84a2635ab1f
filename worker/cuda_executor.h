// The cuda backend's executor: the CUDA kernels over a cuda arena mapping, on one stream.
// Synthetic activations are generated on the GPU (the same bits as the CPU generator); tensors a
// job carries are copied up. Built only with CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda_ops.h"
#include "kvpool/layout/block_layout.h"
#include "worker/executor.h"
#include "worker/job_inputs.h"

namespace kvp {

class CudaExecutor : public Executor {
 public:
  // REQUIRES: base (a device address on `device`) maps num_blocks blocks and outlives this.
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(BlockLayout layout, uint8_t* base,
                                                              JobContext ctx, int device);
  ~CudaExecutor() override;

  // Past this many runs a move's table counts as fragmented (MoveBlocksFrom): one kernel launch
  // beats a copy per run.
  static constexpr size_t kMaxCopyEngineRuns = 8;

  absl::Status Prefill(const PrefillWork& work) override;
  absl::StatusOr<std::vector<DecodeStepResult>> Decode(const DecodeWork& work) override;
  // `source` is a device address this GPU can read (the same GPU, or a peer's mapped here). Few
  // runs of consecutive blocks go as copy-engine copies, one per run; a fragmented table as one
  // launch of the block move kernel.
  absl::Status MoveBlocksFrom(const uint8_t* source, int64_t source_blocks,
                              const std::vector<BlockCopyPair>& moves) override;

 private:
  CudaExecutor(BlockLayout layout, uint8_t* base, JobContext ctx, cudaStream_t stream);

  // A device copy of `host` in `buffer` (grown as needed), enqueued on the stream.
  template <typename T>
  absl::StatusOr<T*> Upload(const std::vector<T>& host, CudaWorkspace& buffer);
  absl::Status Copy(const std::vector<BlockCopyPair>& copies);
  // Layer `cache`'s `n` new tokens (device arrays) written into their slots: K/V and index keys,
  // or an MLA pool's latents ([n, 576] rows in k) and index keys.
  absl::Status WriteTokens(const LayerCache& cache, const void* k, const void* v,
                           const void* index_k, const int64_t* slots, int64_t n);
  // The steps of a decode job, in the order Decode takes them.
  struct DecodeBuffers;
  absl::StatusOr<DecodeBuffers> PrepareDecode(const DecodeWork& work);
  // Layer `layer`: the new tokens' K/V written into their slots.
  absl::Status WriteDecodeTokens(const DecodeWork& work, int layer, const LayerCache& cache,
                                 DecodeBuffers& b);
  // Layer `layer`: the queries, synthetic or uploaded.
  absl::Status FillDecodeQueries(const DecodeWork& work, int layer, DecodeBuffers& b);
  // Layer `layer`: indexer -> top-k -> sparse (MLA) decode, or dense decode, into output slot
  // `out_slot` of the buffers' outputs (and top-k).
  absl::Status Attend(int layer, const LayerCache& cache, const DecodeBuffers& b,
                      size_t out_slot);
  absl::StatusOr<std::vector<DecodeStepResult>> CollectOutputs(const DecodeWork& work,
                                                               const DecodeBuffers& b);
  // What prefill and decode ask of the synthetic generator alike: K and V (and index keys when
  // `index_k` is not null) of the `n` tokens `tokens` (device) of layer `layer`. The caller says
  // where the tokens' positions come from.
  SyntheticTokensParams SyntheticTokens(int layer, const int32_t* tokens, int64_t n, void* k,
                                        void* v, void* index_k) const;

  BlockLayout layout_;
  uint8_t* base_;
  JobContext ctx_;
  cudaStream_t stream_;
  // Device scratch, grown to the largest job and reused.
  CudaWorkspace kernel_ws_, tokens_, positions_, slots_, tables_, lens_, k_, v_, index_k_, q_,
      index_q_, weights_, seeds_, needle_pos_, needle_tok_, needle_gain_, logits_, indices_, out_,
      topk_, mla_slots_, mla_out_, lse_, move_from_, move_to_;
  // Host staging of client tensors, reused across layers and jobs.
  TokenInputs host_tokens_;
  QueryInputs host_queries_;
};

}  // namespace kvp
