#include "kernels/attention/attention_kernel.cuh"
#include "kernels/sparse_decode/sparse_decode_launch.h"

namespace kvp {

size_t SparseDecodeWorkspaceBytes(const SparseDecodeParams& p) {
  return attention::AttentionWorkspaceBytes<true>(p.attn, p.topk);
}

LaunchStatus SparseDecodeLaunch(const SparseDecodeParams& p, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  attention::PositionSource src;
  src.indices = p.indices;
  src.topk = p.topk;
  return attention::LaunchAttention<true>(p.attn, src, p.topk, workspace, workspace_bytes, stream);
}

}  // namespace kvp
