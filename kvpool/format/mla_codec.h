// Whole runs of `fp8_ds_mla` tokens (mla_latent.h) on the host: what kvpool-format encodes,
// decodes and measures for the MLA latent cache, and what other implementations check against.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/format/section_codec.h"

namespace kvp {

// `values` holds N tokens of 576 float32 (512 latent, then 64 RoPE); N × 656 bytes come back.
// INVALID_ARGUMENT when the count is not a whole number of tokens.
absl::StatusOr<std::vector<uint8_t>> EncodeMlaTokens(absl::Span<const float> values);

// The inverse: N × 656 bytes back to N × 576 float32. INVALID_ARGUMENT for a partial token.
absl::StatusOr<std::vector<float>> DecodeMlaTokens(absl::Span<const uint8_t> bytes);

// An encode/decode round trip of `values` (`vectors` counts tokens; NaN values are skipped).
absl::StatusOr<RoundTripStats> MeasureMlaRoundTrip(absl::Span<const float> values);

}  // namespace kvp
