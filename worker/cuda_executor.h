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

namespace kvp {

class CudaExecutor : public Executor {
 public:
  // REQUIRES: base (a device address on `device`) maps num_blocks blocks and outlives this.
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(BlockLayout layout, uint8_t* base,
                                                              JobContext ctx, int device);
  ~CudaExecutor() override;

  absl::Status Prefill(const PrefillWork& work) override;
  absl::StatusOr<std::vector<DecodeStepResult>> Decode(const DecodeWork& work) override;

 private:
  CudaExecutor(BlockLayout layout, uint8_t* base, JobContext ctx, cudaStream_t stream);

  // A device copy of `host` in `buffer` (grown as needed), enqueued on the stream.
  template <typename T>
  absl::StatusOr<T*> Upload(const std::vector<T>& host, CudaWorkspace& buffer);
  absl::Status Copy(const std::vector<BlockCopyPair>& copies);
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
      topk_;
};

}  // namespace kvp
