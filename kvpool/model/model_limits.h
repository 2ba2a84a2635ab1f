// What the decode model may ask of the kernels: the largest top-k (kernels/topk/) and the query
// heads a kv head (the attention kernels). One place for both; nvcc-safe.
#pragma once

namespace kvp {

inline constexpr int kMaxTopk = 2048;
inline constexpr int kMaxQHeadsPerKvHead = 16;

}  // namespace kvp
