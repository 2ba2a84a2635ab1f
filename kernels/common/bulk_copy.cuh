// Bulk global -> shared copies (sm_90 cp.async.bulk, the copy engine behind TMA) and the shared
// memory barriers that count their bytes. One thread moves a whole contiguous section with one
// instruction instead of every thread issuing 16-byte cp.async and working out their addresses.
//
// Protocol for one stage: a thread announces the bytes on the stage's barrier
// (ArriveExpectingBytes, the barrier's one arrival), then copies are issued (in any thread) against
// that barrier; readers Wait for the phase and may then read the stage with ordinary loads.
#pragma once

#include <cstdint>

namespace kvp::bulk {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initializes a barrier that completes a phase after `arrivals` arrivals and all expected bytes.
// Call from one thread, then FenceInit and a CTA barrier before anyone uses it.
__device__ __forceinline__ void Init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(barrier)),
               "r"(arrivals)
               : "memory");
}

// Makes initialized barriers visible to the copy engine.
__device__ __forceinline__ void FenceInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::
                   : "memory");
}

// One arrival that also expects `bytes` more to land on the barrier in this phase (0 is fine).
__device__ __forceinline__ void ArriveExpectingBytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(barrier)),
      "r"(bytes)
      : "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) and counts them on `barrier`.
__device__ __forceinline__ void Copy(void* smem, const void* gmem, uint32_t bytes,
                                     uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SharedAddress(smem)),
      "l"(gmem), "r"(bytes), "r"(SharedAddress(barrier))
      : "memory");
}

// Waits until the barrier has completed the phase of parity `parity` (0 for its first phase).
__device__ __forceinline__ void Wait(uint64_t* barrier, uint32_t parity) {
  const uint32_t address = SharedAddress(barrier);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace kvp::bulk
