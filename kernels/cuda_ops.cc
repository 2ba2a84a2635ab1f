#include "kernels/cuda_ops.h"

#include "kernels/block_copy/block_copy_launch.h"
#include "kernels/cache_write/cache_write_launch.h"
#include "kernels/mla/mla_launch.h"
#include "kernels/common/cuda_status.h"
#include "kernels/indexer_logits/indexer_logits_launch.h"
#include "kernels/paged_decode/paged_decode_launch.h"
#include "kernels/sparse_decode/sparse_decode_launch.h"
#include "kernels/topk/topk_launch.h"

namespace kvp {

namespace {

// Grows `buffer` to at least `bytes`, zeroed if asked; the old contents are not kept.
absl::StatusOr<void*> Grow(DeviceBuffer& buffer, size_t bytes, bool zeroed) {
  if (bytes > buffer.bytes()) {
    KVP_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // the old buffer may still be in use
    buffer = DeviceBuffer();
    absl::StatusOr<DeviceBuffer> grown = DeviceBuffer::Allocate(bytes);
    if (!grown.ok()) return grown.status();
    if (zeroed) KVP_CUDA_RETURN_IF_ERROR(cudaMemset(grown->get(), 0, bytes));
    buffer = std::move(*grown);
  }
  return buffer.get();
}

// Sizes the workspace for one launch, grows it if needed, and launches with it.
template <typename Launch>
absl::Status LaunchWithWorkspace(size_t bytes, CudaWorkspace& workspace, const char* op,
                                 Launch&& launch) {
  absl::StatusOr<void*> ws = workspace.Get(bytes);
  if (!ws.ok()) return ws.status();
  return LaunchToStatus(launch(*ws, bytes), op);
}

}  // namespace

absl::StatusOr<void*> CudaWorkspace::Get(size_t bytes) { return Grow(buffer_, bytes, false); }

absl::StatusOr<void*> CudaWorkspace::GetZeroed(size_t bytes) { return Grow(zeroed_, bytes, true); }

absl::Status CacheWriteCuda(const CacheWriteParams& p, cudaStream_t stream) {
  return LaunchToStatus(CacheWriteLaunch(p, stream), "cache write");
}

absl::Status MlaCacheWriteCuda(const MlaCacheWriteParams& p, cudaStream_t stream) {
  return LaunchToStatus(MlaCacheWriteLaunch(p, stream), "MLA cache write");
}

absl::Status SlotsOfPositionsCuda(const SlotsOfPositionsParams& p, cudaStream_t stream) {
  return LaunchToStatus(SlotsOfPositionsLaunch(p, stream), "top-k slots");
}

absl::Status SparseMlaDecodeCuda(const SparseMlaDecodeParams& p, CudaWorkspace& workspace,
                                 cudaStream_t stream) {
  return LaunchWithWorkspace(
      SparseMlaDecodeWorkspaceBytes(p), workspace, "sparse MLA decode",
      [&](void* ws, size_t bytes) { return SparseMlaDecodeLaunch(p, ws, bytes, stream); });
}

absl::Status PagedDecodeCuda(const PagedDecodeParams& p, CudaWorkspace& workspace,
                             cudaStream_t stream) {
  return LaunchWithWorkspace(
      PagedDecodeWorkspaceBytes(p), workspace, "paged decode",
      [&](void* ws, size_t bytes) { return PagedDecodeLaunch(p, ws, bytes, stream); });
}

absl::Status SparseDecodeCuda(const SparseDecodeParams& p, CudaWorkspace& workspace,
                              cudaStream_t stream) {
  return LaunchWithWorkspace(
      SparseDecodeWorkspaceBytes(p), workspace, "sparse decode",
      [&](void* ws, size_t bytes) { return SparseDecodeLaunch(p, ws, bytes, stream); });
}

absl::Status IndexerLogitsCuda(const IndexerLogitsParams& p, cudaStream_t stream) {
  return LaunchToStatus(IndexerLogitsLaunch(p, stream), "indexer logits");
}

absl::Status TopkCuda(const TopkParams& p, CudaWorkspace& workspace, cudaStream_t stream) {
  const TopkWorkspaceSizes sizes = TopkWorkspaceBytes(p);
  absl::StatusOr<void*> counters = workspace.GetZeroed(sizes.counter_bytes);
  if (!counters.ok()) return counters.status();
  return LaunchWithWorkspace(sizes.scratch_bytes, workspace, "top-k", [&](void* ws, size_t bytes) {
    return TopkLaunch(p, TopkWorkspace{ws, bytes, *counters, sizes.counter_bytes}, stream);
  });
}

absl::Status GatherBlocksCuda(const BlockCopyParams& p, cudaStream_t stream) {
  return LaunchToStatus(GatherBlocksLaunch(p, stream), "block gather");
}

absl::Status ScatterBlocksCuda(const BlockCopyParams& p, cudaStream_t stream) {
  return LaunchToStatus(ScatterBlocksLaunch(p, stream), "block scatter");
}

absl::Status MoveBlocksCuda(const BlockMoveParams& p, cudaStream_t stream) {
  return LaunchToStatus(MoveBlocksLaunch(p, stream), "block move");
}

absl::Status SyntheticTokensCuda(const SyntheticTokensParams& p, cudaStream_t stream) {
  return LaunchToStatus(SyntheticTokensLaunch(p, stream), "synthetic tokens");
}

absl::Status SyntheticQueriesCuda(const SyntheticQueriesParams& p, cudaStream_t stream) {
  return LaunchToStatus(SyntheticQueriesLaunch(p, stream), "synthetic queries");
}

}  // namespace kvp
