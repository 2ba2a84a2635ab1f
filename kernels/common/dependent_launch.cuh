// Programmatic dependent launch (sm_90): the kernels of one decode step (indexer -> top-k ->
// attention parts -> combine), and cache writes, are each launched while the kernel before them on
// the stream is still running, so a launch and its CTAs' start-up overlap the previous kernel's
// tail instead of following it.
//
// The rule every kernel launched with LaunchDependent keeps: it calls WaitForPredecessor() before
// its first global-memory access (read or write). Until then the kernel before it may still be
// writing its inputs, or reading what this kernel writes (a workspace). The wait returns once that
// kernel has completed and its writes are visible, so it orders this kernel after everything
// earlier on the stream, exactly as a plain launch would.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace kvp {

// Lets the next kernel on the stream (if launched with LaunchDependent) start its CTAs now; they
// start only once every CTA of this grid has called this or exited, and wait before any access.
__device__ __forceinline__ void LetDependentsLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Blocks until the kernel before this one on the stream has completed and its writes are visible.
// A no-op when this kernel was launched without LaunchDependent.
__device__ __forceinline__ void WaitForPredecessor() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) allowed to start before the
// previous kernel on the stream completes; `cooperative` also makes it a cooperative launch.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                            cudaStream_t stream, bool cooperative, Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cooperative ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvp
