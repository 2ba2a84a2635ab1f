#include <cstdint>

#include "bench/l2_eviction.h"
#include "kernels/common/cuda_status.h"
#include "kernels/common/work_split.h"

namespace kvp::bench {
namespace {

constexpr size_t kEvictionBytes = size_t{256} << 20;  // several times any GPU's L2
constexpr int kThreads = 512;

// XORs every word of `data`; the sum is stored only if it matches a value the buffer's pattern
// cannot give, which keeps the loads without writing anything.
__global__ void __launch_bounds__(kThreads)
    ReadAll(const uint4* data, size_t count, uint32_t* sink) {
  uint32_t sum = 0;
  const size_t stride = size_t{gridDim.x} * kThreads;
  for (size_t i = size_t{blockIdx.x} * kThreads + threadIdx.x; i < count; i += stride) {
    const uint4 v = __ldcg(&data[i]);
    sum ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (sum == 0xFFFFFFFFu) *sink = sum;
}

}  // namespace

absl::Status EvictL2(cudaStream_t stream) {
  static void* buffer = nullptr;
  if (buffer == nullptr) {
    KVP_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer, kEvictionBytes + sizeof(uint32_t)));
    // Every word 0x5A5A5A5A: four of them XOR to zero, never to the sink's trigger.
    KVP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer, 0x5A, kEvictionBytes, stream));
  }
  auto* data = static_cast<const uint4*>(buffer);
  auto* sink = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(buffer) + kEvictionBytes);
  ReadAll<<<SmCount() * 4, kThreads, 0, stream>>>(data, kEvictionBytes / sizeof(uint4), sink);
  KVP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace kvp::bench
