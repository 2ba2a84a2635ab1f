// What the decode model may ask of the kernels: the largest top-k (kernels/topk/), the query heads
// a kv head (the attention kernels) or an MLA pool (sparse MLA decode), and DeepSeek-V3.2's softmax
// scale. One place for each; nvcc-safe.
#pragma once

namespace kvp {

inline constexpr int kMaxTopk = 2048;
inline constexpr int kMaxQHeadsPerKvHead = 16;
inline constexpr int kMaxMlaQHeads = 128;  // sparse MLA decode: 16, 32, ... 128 heads

// DeepSeek-V3.2's softmax scale: 1/√192 (its query-key head before absorption) times YaRN's
// mscale² = (0.1 · ln 40 + 1)², about 0.1352; never 1/√576.
inline constexpr float kDeepSeekV32SoftmaxScale = 0.1352f;

}  // namespace kvp
