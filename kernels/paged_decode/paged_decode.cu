#include "kernels/attention/attention_kernel.cuh"
#include "kernels/paged_decode/paged_decode_launch.h"

namespace kvp {
namespace {

int Positions(const PagedDecodeParams& p) {
  const int span = p.window > 0 ? p.window + attention::kTile : p.attn.max_seq_len;
  return span < p.attn.max_seq_len ? span : p.attn.max_seq_len;
}

}  // namespace

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) {
  return attention::AttentionWorkspaceBytes<false>(p.attn, Positions(p));
}

LaunchStatus PagedDecodeLaunch(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  attention::PositionSource src;
  src.window = p.window;
  return attention::LaunchAttention<false>(p.attn, src, Positions(p), workspace, workspace_bytes,
                                           stream);
}

}  // namespace kvp
