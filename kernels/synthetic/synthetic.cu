#include "kernels/synthetic/synthetic_launch.h"
#include "kvpool/format/indexer_quant.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) SyntheticTokensKernel(SyntheticTokensParams p) {
  const int64_t row = int64_t{p.num_kv_heads} * p.head_dim;
  const int64_t kv_rows = p.v != nullptr ? 2 * row : row;  // no V: MLA pools
  const int64_t per_token = kv_rows + (p.index_k != nullptr ? kIndexHeadDim : 0);
  const int64_t total = p.num_tokens * per_token;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t t = i / per_token;
    int64_t r = i % per_token;
    const int32_t token = p.tokens[t];
    const uint32_t pos =
        static_cast<uint32_t>(p.positions != nullptr ? p.positions[t] : p.first_position + t);
    if (r < kv_rows) {
      const bool is_value = r >= row;
      if (is_value) r -= row;
      const uint32_t head = static_cast<uint32_t>(r / p.head_dim);
      const uint32_t e = static_cast<uint32_t>(r % p.head_dim);
      const Bf16 x =
          SyntheticTokenValue(p.config, is_value ? SyntheticStream::kValue : SyntheticStream::kKey,
                              p.layer, token, pos, head, p.head_dim, e);
      (is_value ? p.v : p.k)[t * row + r] = x;
    } else {
      const uint32_t e = static_cast<uint32_t>(r - kv_rows);
      p.index_k[t * kIndexHeadDim + e] = SyntheticTokenValue(
          p.config, SyntheticStream::kIndexKey, p.layer, token, pos, 0, kIndexHeadDim, e);
    }
  }
}

// One thread per query element; the index-query part of a step follows its q part.
__global__ void __launch_bounds__(kThreads) SyntheticQueriesKernel(SyntheticQueriesParams p) {
  const int64_t q_row = int64_t{p.num_q_heads} * p.head_dim;
  const int64_t idx_row = p.index_q != nullptr ? int64_t{kIndexHeads} * kIndexHeadDim : 0;
  const int64_t per_step = q_row + idx_row;
  const int64_t total = int64_t{p.num_steps} * per_step;
  const int group = p.num_q_heads / p.num_kv_heads;
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t s = i / per_step;
    const int64_t r = i % per_step;
    const uint64_t seed = p.step_seeds[s];
    const bool needle = p.needle_positions[s] >= 0;
    const float gain = needle ? p.needle_gains[s] : 0.0f;
    const uint32_t npos = needle ? static_cast<uint32_t>(p.needle_positions[s]) : 0;
    const int32_t ntoken = p.needle_tokens[s];
    if (r < q_row) {
      const uint32_t qh = static_cast<uint32_t>(r / p.head_dim);
      const uint32_t e = static_cast<uint32_t>(r % p.head_dim);
      const Bf16 key = needle ? SyntheticTokenValue(p.config, SyntheticStream::kKey, p.layer,
                                                    ntoken, npos, qh / group, p.head_dim, e)
                              : Bf16{0};
      p.q[s * q_row + r] = SyntheticQueryValue(p.config, SyntheticStream::kQuery, p.layer, seed,
                                               qh, p.head_dim, e, gain, key);
    } else {
      const int64_t j = r - q_row;
      const uint32_t h = static_cast<uint32_t>(j / kIndexHeadDim);
      const uint32_t e = static_cast<uint32_t>(j % kIndexHeadDim);
      const Bf16 key = needle ? SyntheticTokenValue(p.config, SyntheticStream::kIndexKey, p.layer,
                                                    ntoken, npos, 0, kIndexHeadDim, e)
                              : Bf16{0};
      p.index_q[s * idx_row + j] = SyntheticQueryValue(
          p.config, SyntheticStream::kIndexQuery, p.layer, seed, h, kIndexHeadDim, e, gain, key);
      if (e == 0) p.weights[s * kIndexHeads + h] = SyntheticIndexWeight(p.layer, seed, h);
    }
  }
}

}  // namespace

LaunchStatus SyntheticQueriesLaunch(const SyntheticQueriesParams& p, cudaStream_t stream) {
  if (p.num_steps == 0) return {};
  SyntheticQueriesKernel<<<1024, kThreads, 0, stream>>>(p);
  return LastLaunchError();
}

LaunchStatus SyntheticTokensLaunch(const SyntheticTokensParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return {};
  SyntheticTokensKernel<<<1024, kThreads, 0, stream>>>(p);
  return LastLaunchError();
}

}  // namespace kvp
