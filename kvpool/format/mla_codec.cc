#include "kvpool/format/mla_codec.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {

absl::StatusOr<std::vector<uint8_t>> EncodeMlaTokens(absl::Span<const float> values) {
  if (values.size() % kMlaInputDim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        values.size(), " float32 values are not a whole number of ", kMlaInputDim,
        "-value MLA tokens (", kMlaLatentDim, " latent, then ", kMlaRopeDim, " RoPE)"));
  }
  const size_t tokens = values.size() / kMlaInputDim;
  std::vector<uint8_t> out(tokens * kMlaTokenBytes);
  for (size_t t = 0; t < tokens; ++t) {
    EncodeMlaToken(values.data() + t * kMlaInputDim, out.data() + t * kMlaTokenBytes);
  }
  return out;
}

absl::StatusOr<std::vector<float>> DecodeMlaTokens(absl::Span<const uint8_t> bytes) {
  if (bytes.size() % kMlaTokenBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(bytes.size(), " bytes are not a whole number of ",
                                                   kMlaTokenBytes, "-byte fp8_ds_mla tokens"));
  }
  const size_t tokens = bytes.size() / kMlaTokenBytes;
  std::vector<float> out(tokens * kMlaInputDim);
  for (size_t t = 0; t < tokens; ++t) {
    DecodeMlaToken(bytes.data() + t * kMlaTokenBytes, out.data() + t * kMlaInputDim);
  }
  return out;
}

absl::StatusOr<RoundTripStats> MeasureMlaRoundTrip(absl::Span<const float> values) {
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, EncodeMlaTokens(values));
  ASSIGN_OR_RETURN(const std::vector<float> back, DecodeMlaTokens(bytes));
  return CompareRoundTrip(values, back, static_cast<int64_t>(values.size() / kMlaInputDim),
                          kMlaTokenBytes);
}

}  // namespace kvp
