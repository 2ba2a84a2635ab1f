// Per-layer scales from sample activations (docs/design.md §3: k_scale, v_scale), as
// `kvpoolctl calibrate` picks them for kvpoold's --k_scales and --v_scales.
//
// Both scales exist to keep stored values in E4M3's normal range: K itself (fp8_e4m3), and the
// TurboNV group scales of V, which for V of small magnitude (σ ≈ 1e-3) would otherwise be mostly
// E4M3 subnormals. The scale chosen is the power of two (so that dividing by it is exact) whose
// stored bytes reproduce the sample with the least squared error, found by encoding the sample
// with the format's own codec at every candidate.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

inline constexpr int kCalibrationMinExponent = -40;
inline constexpr int kCalibrationMaxExponent = 16;

struct CalibrationResult {
  float scale = 1.0f;
  double relative_mse = 0;         // at `scale`: Σ(x̂ - x)² / Σx²
  double relative_mse_at_one = 0;  // at scale 1, for comparison
};

// `values`: whole token-head vectors of `head_dim` (a multiple of head_dim values), finite. For a
// format without a scale (bf16, indexer) the result is scale 1. `rotate`: TurboNV's rotation.
CalibrationResult CalibrateScale(absl::Span<const float> values, int head_dim, KvFormat format,
                                 bool rotate);

}  // namespace kvp
