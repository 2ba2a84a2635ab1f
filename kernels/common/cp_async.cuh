// Asynchronous global -> shared copies (sm_80+ cp.async), shared by the kernels that stage data.
#pragma once

#include <cstdint>

namespace kvp::cp_async {

// Copies kSize bytes (4, 8 or 16); bytes_valid = 0 fills the destination with zeros instead.
template <int kSize>
__device__ __forceinline__ void Copy(void* smem, const void* gmem, int bytes_valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kSize == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(bytes_valid));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem),
                 "n"(kSize), "r"(bytes_valid));
  }
}

// Copies kSize bytes (4, 8 or 16), or fills the destination with zeros when `valid` is false.
template <int kSize>
__device__ __forceinline__ void CopyOrZero(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kSize == 16) {
    asm volatile(
        "{\n .reg .pred skip;\n setp.eq.u32 skip, %2, 0;\n"
        " cp.async.cg.shared.global [%0], [%1], 16, skip;\n}\n" ::"r"(dst),
        "l"(gmem), "r"(static_cast<unsigned>(valid)));
  } else {
    asm volatile(
        "{\n .reg .pred skip;\n setp.eq.u32 skip, %3, 0;\n"
        " cp.async.ca.shared.global [%0], [%1], %2, skip;\n}\n" ::"r"(dst),
        "l"(gmem), "n"(kSize), "r"(static_cast<unsigned>(valid)));
  }
}

__device__ __forceinline__ void Commit() { asm volatile("cp.async.commit_group;\n"); }

// One arrival on a shared-memory barrier (kernels/common/bulk_copy.cuh) once every copy this
// thread has issued so far has landed; the barrier's arrival count includes it (.noinc).
__device__ __forceinline__ void ArriveWhenLanded(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(barrier)))
               : "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void Wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace kvp::cp_async
