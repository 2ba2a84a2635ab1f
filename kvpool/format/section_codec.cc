#include "kvpool/format/section_codec.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/head_codec.h"
#include "kvpool/format/kv_format_names.h"

namespace kvp {
namespace {

HeadCodec MakeCodec(const SectionCodecOptions& o) {
  HeadCodec c;
  c.format = o.format;
  c.scale = o.scale;
  c.rotate = o.rotation;
  c.ue8m0 = o.ue8m0;
  if (IsSupportedHeadDim(o.head_dim)) c.signs = MakeRotationSigns(o.head_dim);
  return c;
}

bool CanHold(KvFormat format, float x) {
  switch (format) {
    case KvFormat::kBf16:
      return true;
    case KvFormat::kFp8E4m3:
      return !std::isinf(x);
    default:
      return std::isfinite(x);
  }
}

}  // namespace

absl::Status ValidateSectionCodecOptions(const SectionCodecOptions& o) {
  if (o.format == KvFormat::kIndexer) {
    if (o.head_dim != kIndexHeadDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("indexer keys have head dim 128, not ", o.head_dim));
    }
  } else if (!IsSupportedHeadDim(o.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("head dim ", o.head_dim, " is not supported; use 64, 128 or 256"));
  }
  if (!(o.scale > 0.0f) || !std::isfinite(o.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale ", o.scale, " must be finite and positive"));
  }
  return absl::OkStatus();
}

int64_t SectionBytesPerVector(const SectionCodecOptions& o) {
  return TraitsOf(o.format).TotalBytes(o.head_dim);
}

absl::StatusOr<std::vector<uint8_t>> EncodeSections(const SectionCodecOptions& o,
                                                    absl::Span<const float> values) {
  RETURN_IF_ERROR(ValidateSectionCodecOptions(o));
  const int d = o.head_dim;
  if (values.size() % d != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(values.size(), " values are not a whole number of ", d, "-element vectors"));
  }
  const int64_t n = static_cast<int64_t>(values.size()) / d;
  for (int64_t i = 0; i < n * d; ++i) {
    if (!CanHold(o.format, values[i])) {
      return absl::InvalidArgumentError(absl::StrCat("vector ", i / d, " element ", i % d, " is ",
                                                     values[i], ", which ", KvFormatName(o.format),
                                                     " cannot hold"));
    }
  }
  const FormatTraits traits = TraitsOf(o.format);
  const int64_t data_bytes = traits.DataBytes(d), scale_bytes = traits.ScaleBytes(d);
  std::vector<uint8_t> out(n * (data_bytes + scale_bytes));
  const HeadCodec codec = MakeCodec(o);
  for (int64_t i = 0; i < n; ++i) {
    EncodeHead(codec, values.data() + i * d, d, out.data() + i * data_bytes,
               out.data() + n * data_bytes + i * scale_bytes);
  }
  return out;
}

absl::StatusOr<std::vector<float>> DecodeSections(const SectionCodecOptions& o,
                                                  absl::Span<const uint8_t> bytes) {
  RETURN_IF_ERROR(ValidateSectionCodecOptions(o));
  const int d = o.head_dim;
  const FormatTraits traits = TraitsOf(o.format);
  const int64_t data_bytes = traits.DataBytes(d), scale_bytes = traits.ScaleBytes(d);
  const int64_t per_vector = data_bytes + scale_bytes;
  if (static_cast<int64_t>(bytes.size()) % per_vector != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.size(), " bytes are not a whole number of ", KvFormatName(o.format),
                     " vectors of ", per_vector, " bytes (head dim ", d, ")"));
  }
  const int64_t n = static_cast<int64_t>(bytes.size()) / per_vector;
  std::vector<float> out(n * d);
  const HeadCodec codec = MakeCodec(o);
  for (int64_t i = 0; i < n; ++i) {
    DecodeHead(codec, bytes.data() + i * data_bytes,
               bytes.data() + n * data_bytes + i * scale_bytes, d, out.data() + i * d);
  }
  return out;
}

RoundTripStats CompareRoundTrip(absl::Span<const float> original, absl::Span<const float> back,
                                int64_t vectors, int64_t bytes_per_vector) {
  RoundTripStats stats;
  stats.vectors = vectors;
  stats.bytes_per_vector = bytes_per_vector;
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < original.size(); ++i) {
    if (std::isnan(original[i])) continue;
    const double diff = double{back[i]} - original[i];
    err += diff * diff;
    ref += double{original[i]} * original[i];
    stats.max_abs_error = std::max(stats.max_abs_error, std::fabs(diff));
  }
  stats.relative_mse =
      ref > 0.0 ? err / ref : (err > 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
  stats.snr_db = -10.0 * std::log10(stats.relative_mse);
  return stats;
}

absl::StatusOr<RoundTripStats> MeasureRoundTrip(const SectionCodecOptions& o,
                                                absl::Span<const float> values) {
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, EncodeSections(o, values));
  ASSIGN_OR_RETURN(const std::vector<float> back, DecodeSections(o, bytes));
  return CompareRoundTrip(values, back, static_cast<int64_t>(values.size()) / o.head_dim,
                          SectionBytesPerVector(o));
}

}  // namespace kvp
