// Whole sections of one head: N token vectors encoded the way they sit in the cache, data rows
// first, then scale rows (docs/design.md §3-§4). The host API behind kvpool-format, for anyone who
// needs the cache's bytes without a pool: other implementations checking compatibility, tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

struct SectionCodecOptions {
  KvFormat format = KvFormat::kTurbo3;
  int head_dim = 128;    // 64, 128 or 256; 128 for indexer
  float scale = 1.0f;    // k_scale (fp8_e4m3) or v_scale (turboN)
  bool rotation = true;  // turboN
  bool ue8m0 = true;     // indexer
};

// INVALID_ARGUMENT for a head dim the format cannot take or a non-positive scale.
absl::Status ValidateSectionCodecOptions(const SectionCodecOptions& options);

// Bytes one token-head occupies across the format's sections.
int64_t SectionBytesPerVector(const SectionCodecOptions& options);

// Encodes values.size() / head_dim vectors: [N × data bytes][N × scale bytes]. INVALID_ARGUMENT
// when the count is not a whole number of vectors or a value is one the format cannot hold
// (±inf for fp8_e4m3; NaN or ±inf for turboN and indexer), naming the vector and element.
absl::StatusOr<std::vector<uint8_t>> EncodeSections(const SectionCodecOptions& options,
                                                    absl::Span<const float> values);

// Inverse of EncodeSections: N × head_dim float32 values (turboN rotated back).
absl::StatusOr<std::vector<float>> DecodeSections(const SectionCodecOptions& options,
                                                  absl::Span<const uint8_t> bytes);

struct RoundTripStats {
  int64_t vectors = 0;
  int64_t bytes_per_vector = 0;
  double relative_mse = 0.0;  // Σ (x̂ - x)² / Σ x²
  double snr_db = 0.0;        // -10 log10(relative_mse)
  double max_abs_error = 0.0;
};

absl::StatusOr<RoundTripStats> MeasureRoundTrip(const SectionCodecOptions& options,
                                                absl::Span<const float> values);

// The error of `back`, a round trip of `original` (same length), in `vectors` vectors of
// `bytes_per_vector` bytes; NaN values of `original` are left out.
RoundTripStats CompareRoundTrip(absl::Span<const float> original, absl::Span<const float> back,
                                int64_t vectors, int64_t bytes_per_vector);

}  // namespace kvp
