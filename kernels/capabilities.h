// What each backend's kernels serve (docs/design.md §5), as FlashMLA's implementations declare
// their features: one table per backend, which the CUDA launchers check before they dispatch and
// from which workers say what they can serve when they register. A worker that registers for a
// pool can run every job of its role on it. nvcc-safe.
#pragma once

#include "kvpool/format/op_capabilities.h"

namespace kvp {

struct BackendCapabilities {
  OpCapabilities cache_write;  // prefill jobs, and each decode step's new token
  OpCapabilities attention;    // dense and sparse decode

  // Decode jobs write the new token, then attend.
  constexpr OpCapabilities Decode() const { return cache_write.And(attention); }
};

// The CPU references serve every format in every role it may fill.
inline constexpr BackendCapabilities kHostCapabilities{
    .cache_write = {FormatsOf({KvFormat::kBf16, KvFormat::kFp8E4m3}),
                    FormatsOf(
                        {KvFormat::kBf16, KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4}),
                    kAllHeadDims, true},
    .attention = {FormatsOf({KvFormat::kBf16, KvFormat::kFp8E4m3}),
                  FormatsOf(
                      {KvFormat::kBf16, KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4}),
                  kAllHeadDims, true},
};

// The CUDA kernels: the cache write handles bf16 too (comparison runs), the tensor-core attention
// FP8 K and TurboNV V only.
inline constexpr BackendCapabilities kCudaCapabilities{
    .cache_write = {FormatsOf({KvFormat::kBf16, KvFormat::kFp8E4m3}),
                    FormatsOf(
                        {KvFormat::kBf16, KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4}),
                    kAllHeadDims, true},
    .attention = {FormatsOf({KvFormat::kFp8E4m3}),
                  FormatsOf({KvFormat::kTurbo2, KvFormat::kTurbo3, KvFormat::kTurbo4}),
                  kAllHeadDims, true},
};

}  // namespace kvp
