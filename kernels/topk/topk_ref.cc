#include "kernels/topk/topk_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvp {

absl::Status TopkRef(const TopkParams& p) {
  if (p.k < 1 || p.k > kMaxTopk) {
    return absl::InvalidArgumentError(
        absl::StrCat("k = ", p.k, "; must be in [1, ", kMaxTopk, "]"));
  }
  if (p.num_rows > 0 && (p.scores == nullptr || p.lengths == nullptr || p.indices == nullptr)) {
    return absl::InvalidArgumentError("top-k needs scores, lengths and indices");
  }
  std::vector<int32_t> candidates;
  for (int r = 0; r < p.num_rows; ++r) {
    const int32_t len = p.lengths[r];
    if (len < 0 || len > p.scores_stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths[", r, "] = ", len, "; scores_stride is ", p.scores_stride));
    }
    const float* row = p.scores + int64_t{r} * p.scores_stride;
    candidates.clear();
    for (int32_t n = 0; n < len; ++n) {
      if (!std::isnan(row[n])) candidates.push_back(n);
    }
    if (static_cast<int>(candidates.size()) > p.k) {
      std::nth_element(
          candidates.begin(), candidates.begin() + (p.k - 1), candidates.end(),
          [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      candidates.resize(p.k);
      std::sort(candidates.begin(), candidates.end());
    }
    int32_t* out = p.indices + int64_t{r} * p.k;
    std::copy(candidates.begin(), candidates.end(), out);
    std::fill(out + candidates.size(), out + p.k, -1);
  }
  return absl::OkStatus();
}

}  // namespace kvp
