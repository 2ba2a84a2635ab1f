#include "kernels/topk/topk_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/layout/layer_cache.h"

namespace kvp {

namespace {

// Row r's selected positions as physical slots (TopkParams.slots).
absl::Status SlotsOfRow(const TopkParams& p, int r) {
  const int32_t* table = p.block_tables + int64_t{r} * p.block_table_stride;
  for (int64_t i = int64_t{r} * p.k; i < int64_t{r + 1} * p.k; ++i) {
    const int32_t pos = p.indices[i];
    if (pos >= int64_t{p.block_table_stride} * p.block_size) {
      return absl::OutOfRangeError(
          absl::StrCat("position ", pos, " of row ", r, " is past its block table"));
    }
    p.slots[i] = pos < 0 ? -1 : static_cast<int32_t>(SlotOfPosition(table, pos, p.block_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TopkRef(const TopkParams& p) {
  if (p.k < 1 || p.k > kMaxTopk) {
    return absl::InvalidArgumentError(
        absl::StrCat("k = ", p.k, "; must be in [1, ", kMaxTopk, "]"));
  }
  if (p.num_rows > 0 && (p.scores == nullptr || p.lengths == nullptr || p.indices == nullptr)) {
    return absl::InvalidArgumentError("top-k needs scores, lengths and indices");
  }
  if (p.slots != nullptr && (p.block_tables == nullptr || p.block_size < 1)) {
    return absl::InvalidArgumentError("top-k slots need a block table and a block size");
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
    if (p.slots != nullptr) RETURN_IF_ERROR(SlotsOfRow(p, r));
  }
  return absl::OkStatus();
}

}  // namespace kvp
