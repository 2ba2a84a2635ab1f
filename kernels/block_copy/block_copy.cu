// Whole-block copies in 16-byte vectors: CTA (i, j) copies slice j of block i, so one launch moves
// any number of blocks with every SM busy. Gather, scatter and move differ only in which side is
// addressed by block ids. Block strides are multiples of 256 bytes (BlockLayout).
#include <cstdint>

#include "kernels/block_copy/block_copy_launch.h"

namespace kvp {
namespace {

constexpr int kThreads = 256;
constexpr int kVectorsPerThread = 4;
constexpr int64_t kSliceBytes = int64_t{kThreads} * kVectorsPerThread * 16;

// One side of a copy: block i of the launch is block ids[i] of `base`, or the i-th block of a
// staging buffer when there are no ids.
struct Blocks {
  const uint8_t* base;
  const int32_t* ids;  // null: staging
  __device__ int64_t Offset(int i, int64_t stride) const {
    return (ids != nullptr ? int64_t{ids[i]} : int64_t{i}) * stride;
  }
};

__global__ void __launch_bounds__(kThreads) BlockCopyKernel(Blocks from, Blocks to, int64_t stride) {
  const int i = blockIdx.x;
  const uint8_t* src = from.base + from.Offset(i, stride);
  uint8_t* dst = const_cast<uint8_t*>(to.base) + to.Offset(i, stride);
  const int64_t first = int64_t{blockIdx.y} * kSliceBytes;
  uint4 v[kVectorsPerThread];
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int64_t off = first + (int64_t{k} * kThreads + threadIdx.x) * 16;
    if (off < stride) v[k] = __ldcs(reinterpret_cast<const uint4*>(src + off));
  }
#pragma unroll
  for (int k = 0; k < kVectorsPerThread; ++k) {
    const int64_t off = first + (int64_t{k} * kThreads + threadIdx.x) * 16;
    if (off < stride) __stcs(reinterpret_cast<uint4*>(dst + off), v[k]);
  }
}

LaunchStatus Launch(Blocks from, Blocks to, int32_t num_blocks, int64_t stride,
                    cudaStream_t stream) {
  if (stride % 16 != 0) return Unsupported("block strides that are not multiples of 16");
  if (num_blocks == 0) return {};
  const dim3 grid(num_blocks, static_cast<unsigned>((stride + kSliceBytes - 1) / kSliceBytes));
  BlockCopyKernel<<<grid, kThreads, 0, stream>>>(from, to, stride);
  return LastLaunchError();
}

}  // namespace

LaunchStatus GatherBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream) {
  return Launch({p.arena, p.block_ids}, {p.staging, nullptr}, p.num_blocks, p.block_stride,
                stream);
}

LaunchStatus ScatterBlocksLaunch(const BlockCopyParams& p, cudaStream_t stream) {
  return Launch({p.staging, nullptr}, {p.arena, p.block_ids}, p.num_blocks, p.block_stride,
                stream);
}

LaunchStatus MoveBlocksLaunch(const BlockMoveParams& p, cudaStream_t stream) {
  return Launch({p.source, p.source_ids}, {p.target, p.target_ids}, p.num_blocks, p.block_stride,
                stream);
}

}  // namespace kvp
