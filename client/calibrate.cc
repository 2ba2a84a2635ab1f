#include "client/calibrate.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "kvpool/format/calibration.h"
#include "kvpool/format/kv_format_names.h"

namespace kvp {
namespace {

// The samples of `path`, split per layer.
absl::StatusOr<std::vector<std::vector<float>>> ReadSamples(const std::string& path, int layers,
                                                            int head_dim) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t per_layer = bytes.size() / sizeof(float) / static_cast<size_t>(layers);
  if (bytes.size() % (sizeof(float) * layers) != 0 || per_layer == 0 ||
      per_layer % static_cast<size_t>(head_dim) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.size(),
                                                   " bytes are not float32 [", layers,
                                                   ", tokens, kv_heads, ", head_dim, "]"));
  }
  std::vector<std::vector<float>> out(layers, std::vector<float>(per_layer));
  for (int l = 0; l < layers; ++l) {
    std::memcpy(out[l].data(), bytes.data() + l * per_layer * sizeof(float),
                per_layer * sizeof(float));
    for (size_t i = 0; i < per_layer; ++i) {
      if (!std::isfinite(out[l][i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": layer ", l, " value ", i, " is not finite"));
      }
    }
  }
  return out;
}

// Calibrates each layer of one file; appends the report lines and returns the scales.
absl::StatusOr<std::vector<float>> CalibrateFile(const std::string& path, const char* what,
                                                 KvFormat format, bool rotate,
                                                 const CalibrateOptions& o, std::string& report) {
  ASSIGN_OR_RETURN(const auto layers, ReadSamples(path, o.layers, o.head_dim));
  std::vector<float> scales;
  for (int l = 0; l < o.layers; ++l) {
    const CalibrationResult r = CalibrateScale(layers[l], o.head_dim, format, rotate);
    scales.push_back(r.scale);
    absl::StrAppendFormat(&report, "layer %d %s (%s): scale %g, rel. MSE %.5f (%.5f at 1)\n", l,
                          what, std::string(KvFormatName(format)), r.scale, r.relative_mse,
                          r.relative_mse_at_one);
  }
  return scales;
}

}  // namespace

absl::StatusOr<std::string> Calibrate(const CalibrateOptions& o) {
  if (o.layers < 1 || o.head_dim < 1) {
    return absl::InvalidArgumentError("--layers and --head_dim must be positive");
  }
  if (o.k_samples.empty() && o.v_samples.empty()) {
    return absl::InvalidArgumentError("give --k_samples, --v_samples or both");
  }
  std::string report, flags;
  if (!o.k_samples.empty()) {
    ASSIGN_OR_RETURN(const std::vector<float> k,
                     CalibrateFile(o.k_samples, "K", o.k_format, false, o, report));
    absl::StrAppend(&flags, "--k_scales=", absl::StrJoin(k, ","), "\n");
  }
  if (!o.v_samples.empty()) {
    ASSIGN_OR_RETURN(const std::vector<float> v,
                     CalibrateFile(o.v_samples, "V", o.v_format, o.v_rotation, o, report));
    absl::StrAppend(&flags, "--v_scales=", absl::StrJoin(v, ","), "\n");
  }
  return absl::StrCat(report, "# kvpoold flags (a flag file takes them as they are):\n", flags);
}

}  // namespace kvp
