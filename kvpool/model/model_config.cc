#include "kvpool/model/model_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvp {

absl::Status ValidateModelConfig(const ModelConfig& model, const PoolSpec& spec) {
  if (spec.mla() && (model.num_q_heads <= 0 || model.num_q_heads % 16 != 0 ||
                     model.num_q_heads > kMaxMlaQHeads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q heads ", model.num_q_heads, " must be a multiple of 16 up to ", kMaxMlaQHeads,
        " for an MLA pool"));
  }
  if (spec.mla() && model.sparse_v_threshold != 0.0f) {
    return absl::InvalidArgumentError("sparse-V is for KV pools; an MLA pool's threshold is 0");
  }
  if (!spec.mla() && (model.num_q_heads <= 0 || model.num_q_heads % spec.num_kv_heads != 0 ||
                      model.num_q_heads / spec.num_kv_heads > kMaxQHeadsPerKvHead)) {
    return absl::InvalidArgumentError(absl::StrCat("q heads ", model.num_q_heads,
                                                   " must be 1 to 16 times the ", spec.num_kv_heads,
                                                   " kv heads"));
  }
  if (!std::isfinite(model.softmax_scale) || model.softmax_scale < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the softmax scale ", model.softmax_scale,
                                                   " is not 0 (the default) or finite and > 0"));
  }
  if (model.topk < 1 || model.topk > kMaxTopk) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k ", model.topk, " is outside [1, ", kMaxTopk, "]"));
  }
  if (!model.sliding_windows.empty()) {
    if (static_cast<int>(model.sliding_windows.size()) != spec.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(model.sliding_windows.size(),
                                                     " sliding windows for ", spec.num_layers,
                                                     " layers: give one, or one per layer"));
    }
    for (int w : model.sliding_windows) {
      if (w < 0) return absl::InvalidArgumentError(absl::StrCat("sliding window ", w, " < 0"));
    }
    if (spec.indexer && std::any_of(model.sliding_windows.begin(), model.sliding_windows.end(),
                                    [](int w) { return w > 0; })) {
      return absl::InvalidArgumentError(
          "sliding windows need a pool without an indexer (dense decode): sparse decode attends "
          "to the positions top-k selects");
    }
  }
  if (!std::isfinite(model.sparse_v_threshold) || model.sparse_v_threshold < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sparse-V threshold ", model.sparse_v_threshold, " is not a finite value >= 0"));
  }
  return absl::OkStatus();
}

float SoftmaxScaleOf(const ModelConfig& model, const PoolSpec& spec) {
  if (model.softmax_scale > 0) return model.softmax_scale;
  return spec.mla() ? kDeepSeekV32SoftmaxScale : 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
}

}  // namespace kvp
