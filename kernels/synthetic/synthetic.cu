#include "kernels/synthetic/synthetic_launch.h"
#include "kvpool/format/indexer_quant.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) SyntheticTokensKernel(SyntheticTokensParams p) {
  const int64_t row = int64_t{p.num_kv_heads} * p.head_dim;
  const int64_t per_token = 2 * row + (p.index_k != nullptr ? kIndexHeadDim : 0);
  const int64_t total = p.num_tokens * per_token;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t t = i / per_token;
    int64_t r = i % per_token;
    const int32_t token = p.tokens[t];
    const uint32_t pos = static_cast<uint32_t>(p.first_position + t);
    if (r < 2 * row) {
      const bool is_value = r >= row;
      if (is_value) r -= row;
      const uint32_t head = static_cast<uint32_t>(r / p.head_dim);
      const uint32_t e = static_cast<uint32_t>(r % p.head_dim);
      const Bf16 x =
          SyntheticTokenValue(p.config, is_value ? SyntheticStream::kValue : SyntheticStream::kKey,
                              p.layer, token, pos, head, p.head_dim, e);
      (is_value ? p.v : p.k)[t * row + r] = x;
    } else {
      const uint32_t e = static_cast<uint32_t>(r - 2 * row);
      p.index_k[t * kIndexHeadDim + e] = SyntheticTokenValue(
          p.config, SyntheticStream::kIndexKey, p.layer, token, pos, 0, kIndexHeadDim, e);
    }
  }
}

}  // namespace

LaunchStatus SyntheticTokensLaunch(const SyntheticTokensParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return {};
  SyntheticTokensKernel<<<1024, kThreads, 0, stream>>>(p);
  return LastLaunchError();
}

}  // namespace kvp
