// kvpoolctl calibrate: per-layer k_scale and v_scale from sample K/V (docs/design.md §3), printed
// as the kvpoold flags that use them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

struct CalibrateOptions {
  // float32 little-endian samples, [layers, tokens, kv_heads, head_dim] each (the layout a model
  // produces them in); either may be empty.
  std::string k_samples, v_samples;
  int layers = 4;
  int head_dim = 128;
  KvFormat k_format = KvFormat::kFp8E4m3;
  KvFormat v_format = KvFormat::kTurbo3;
  bool v_rotation = true;
};

// The report: one line per layer and format (relative MSE at the chosen scale and at 1), then
// the flags (--k_scales=... --v_scales=...). INVALID_ARGUMENT for a file that is not a whole
// number of layers' head vectors or holds NaN or Inf; NOT_FOUND for one that cannot be read.
absl::StatusOr<std::string> Calibrate(const CalibrateOptions& options);

}  // namespace kvp
