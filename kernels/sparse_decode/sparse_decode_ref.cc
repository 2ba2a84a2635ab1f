#include "kernels/sparse_decode/sparse_decode_ref.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/attention/attention_ref.h"

namespace kvp {

absl::Status SparseDecodeRef(const SparseDecodeParams& p) {
  RETURN_IF_ERROR(ValidateAttentionParams(p.attn));
  if (p.topk < 0 || (p.topk > 0 && p.attn.num_seqs > 0 && p.indices == nullptr)) {
    return absl::InvalidArgumentError("sparse decode needs indices and topk >= 0");
  }
  std::vector<int32_t> positions;
  std::vector<bool> seen;
  for (int s = 0; s < p.attn.num_seqs; ++s) {
    const int32_t len = p.attn.seq_lens[s];
    positions.clear();
    seen.assign(len, false);
    for (int i = 0; i < p.topk; ++i) {
      const int32_t pos = p.indices[int64_t{s} * p.topk + i];
      if (pos == -1) continue;
      if (pos < -1 || pos >= len) {
        return absl::OutOfRangeError(
            absl::StrCat("indices[", s, ", ", i, "] = ", pos, "; sequence length is ", len));
      }
      if (seen[pos]) {
        return absl::InvalidArgumentError(
            absl::StrCat("indices row ", s, " selects position ", pos, " twice"));
      }
      seen[pos] = true;
      positions.push_back(pos);
    }
    RETURN_IF_ERROR(AttendPositionsRef(p.attn, s, positions));
  }
  return absl::OkStatus();
}

}  // namespace kvp
