// Whole-block copies in 16-byte vectors: CTA (i, j) copies slice j of block i, so one launch moves
// any number of blocks with every SM busy. Block strides are multiples of 256 bytes (BlockLayout).
#include <cstdint>

#include "kernels/block_copy/block_copy_launch.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorsPerThread = 4;
constexpr int64_t kSliceBytes = int64_t{kThreads} * kVectorsPerThread * 16;

template <bool kGather>
__global__ void __launch_bounds__(kThreads) BlockCopyKernel(BlockCopyParams p) {
  const int i = blockIdx.x;
  const int64_t arena_block = p.block_ids[i];
  const uint8_t* src =
      kGather ? p.arena + arena_block * p.block_stride : p.staging + i * p.block_stride;
  uint8_t* dst = kGather ? p.staging + i * p.block_stride : p.arena + arena_block * p.block_stride;
  const int64_t first = int64_t{blockIdx.y} * kSliceBytes;
  uint4 v[kVectorsPerThread];
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int64_t off = first + (int64_t{k} * kThreads + threadIdx.x) * 16;
    if (off < p.block_stride) v[k] = __ldcs(reinterpret_cast<const uint4*>(src + off));
  }
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int64_t off = first + (int64_t{k} * kThreads + threadIdx.x) * 16;
    if (off < p.block_stride) __stcs(reinterpret_cast<uint4*>(dst + off), v[k]);
  }
}

template <bool kGather>
LaunchStatus Launch(const BlockCopyParams& p, cudaStream_t stream) {
  if (p.block_stride % 16 != 0) return Unsupported("block strides that are not multiples of 16");
  if (p.num_blocks == 0) return {};
  const dim3 grid(p.num_blocks,
                  static_cast<unsigned>((p.block_stride + kSliceBytes - 1) / kSliceBytes));
  BlockCopyKernel<kGather><<<grid, kThreads, 0, stream>>>(p);
  return LastLaunchError();
}

}  // namespace

LaunchStatus GatherBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream) {
  return Launch<true>(p, stream);
}

LaunchStatus ScatterBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream) {
  return Launch<false>(p, stream);
}

}  // namespace kvp
