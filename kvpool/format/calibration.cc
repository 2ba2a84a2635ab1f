#include "kvpool/format/calibration.h"

#include <cmath>
#include <vector>

#include "kvpool/format/head_codec.h"

namespace kvp {
namespace {

// Σ(x̂ - x)² and Σx² of `values` through `codec`, a head at a time.
std::pair<double, double> SquaredErrors(absl::Span<const float> values, int head_dim,
                                        const HeadCodec& codec) {
  const FormatTraits traits = TraitsOf(codec.format);
  std::vector<uint8_t> data(static_cast<size_t>(traits.DataBytes(head_dim)));
  std::vector<uint8_t> scales(static_cast<size_t>(traits.ScaleBytes(head_dim)) + 4);
  std::vector<float> back(static_cast<size_t>(head_dim));
  double err = 0, norm = 0;
  for (size_t at = 0; at + head_dim <= values.size(); at += head_dim) {
    EncodeHead(codec, values.data() + at, head_dim, data.data(), scales.data());
    DecodeHead(codec, data.data(), scales.data(), head_dim, back.data());
    for (int i = 0; i < head_dim; ++i) {
      const double x = values[at + i], e = back[i] - x;
      err += e * e;
      norm += x * x;
    }
  }
  return {err, norm};
}

}  // namespace

CalibrationResult CalibrateScale(absl::Span<const float> values, int head_dim, KvFormat format,
                                 bool rotate) {
  HeadCodec codec;
  codec.format = format;
  codec.rotate = rotate;
  if (TraitsOf(format).turbo && rotate) codec.signs = MakeRotationSigns(head_dim);
  const auto relative = [&](float scale) {
    codec.scale = scale;
    const auto [err, norm] = SquaredErrors(values, head_dim, codec);
    return norm > 0 ? err / norm : 0.0;
  };
  CalibrationResult result;
  result.relative_mse_at_one = relative(1.0f);
  result.relative_mse = result.relative_mse_at_one;
  if (format != KvFormat::kFp8E4m3 && !TraitsOf(format).turbo) return result;
  for (int e = kCalibrationMinExponent; e <= kCalibrationMaxExponent; ++e) {
    const float scale = std::ldexp(1.0f, e);
    const double mse = relative(scale);
    // Ties keep the larger scale: fewer values near saturation.
    if (mse <= result.relative_mse) {
      result.relative_mse = mse;
      result.scale = scale;
    }
  }
  return result;
}

}  // namespace kvp
