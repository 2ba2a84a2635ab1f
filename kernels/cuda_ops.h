// The CUDA kernels behind absl::Status: what workers, benchmarks and tests call. All pointers in
// the params are device pointers; launches are asynchronous on `stream`. UNIMPLEMENTED names a
// format or shape the kernels lack; INTERNAL carries a CUDA error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/block_copy/block_copy_params.h"
#include "kernels/cache_write/cache_write_params.h"
#include "kernels/common/device_buffer.h"
#include "kernels/indexer_logits/indexer_logits_params.h"
#include "kernels/mla/mla_params.h"
#include "kernels/paged_decode/paged_decode_params.h"
#include "kernels/sparse_decode/sparse_decode_params.h"
#include "kernels/synthetic/synthetic_launch.h"
#include "kernels/topk/topk_params.h"

namespace kvp {

// Device scratch that grows to the largest request and is reused; one per stream.
class CudaWorkspace {
 public:
  // A buffer of at least `bytes`; reallocates (synchronously) only to grow.
  absl::StatusOr<void*> Get(size_t bytes);
  size_t bytes() const { return buffer_.bytes(); }

  // A second buffer of at least `bytes` that is all zero whenever no kernel runs on it: zeroed
  // when (re)allocated, and every kernel given it (top-k's counters) leaves it zero.
  absl::StatusOr<void*> GetZeroed(size_t bytes);

 private:
  DeviceBuffer buffer_;
  DeviceBuffer zeroed_;
};

absl::Status CacheWriteCuda(const CacheWriteParams& p, cudaStream_t stream);
absl::Status MlaCacheWriteCuda(const MlaCacheWriteParams& p, cudaStream_t stream);
// REQUIRES: positions from top-k over these block tables.
absl::Status SlotsOfPositionsCuda(const SlotsOfPositionsParams& p, cudaStream_t stream);
absl::Status SparseMlaDecodeCuda(const SparseMlaDecodeParams& p, CudaWorkspace& workspace,
                                 cudaStream_t stream);
absl::Status PagedDecodeCuda(const PagedDecodeParams& p, CudaWorkspace& workspace,
                             cudaStream_t stream);
absl::Status SparseDecodeCuda(const SparseDecodeParams& p, CudaWorkspace& workspace,
                              cudaStream_t stream);
absl::Status IndexerLogitsCuda(const IndexerLogitsParams& p, cudaStream_t stream);
absl::Status TopkCuda(const TopkParams& p, CudaWorkspace& workspace, cudaStream_t stream);
// REQUIRES: every block id is in [0, p.num_arena_blocks) (checked by the caller, who owns them).
absl::Status GatherBlocksCuda(const BlockCopyParams& p, cudaStream_t stream);
absl::Status ScatterBlocksCuda(const BlockCopyParams& p, cudaStream_t stream);
// REQUIRES: ids checked (ValidateBlockMove); both arenas readable/writable from this device.
absl::Status MoveBlocksCuda(const BlockMoveParams& p, cudaStream_t stream);
absl::Status SyntheticTokensCuda(const SyntheticTokensParams& p, cudaStream_t stream);
absl::Status SyntheticQueriesCuda(const SyntheticQueriesParams& p, cudaStream_t stream);

}  // namespace kvp
