#include "kernels/paged_decode/paged_decode_ref.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/attention_ref.h"

namespace kvp {

absl::Status PagedDecodeRef(const PagedDecodeParams& p) {
  RETURN_IF_ERROR(ValidateAttentionParams(p.attn));
  if (p.window < 0) return absl::InvalidArgumentError(absl::StrCat("window = ", p.window, " < 0"));
  std::vector<int32_t> positions;
  for (int s = 0; s < p.attn.num_seqs; ++s) {
    const int32_t len = p.attn.seq_lens[s];
    const int32_t first = p.window > 0 ? std::max(0, len - p.window) : 0;
    positions.resize(len - first);
    std::iota(positions.begin(), positions.end(), first);
    RETURN_IF_ERROR(AttendPositionsRef(p.attn, s, positions));
  }
  return absl::OkStatus();
}

}  // namespace kvp
