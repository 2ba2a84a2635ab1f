// Top-k over indexer scores (docs/design.md §5). The contract every implementation keeps:
//   - a row of length L selects min(k, L') positions, L' = positions in [0, L) whose score is not
//     NaN; NaN is never selected;
//   - when L' > k: the k largest scores, ties broken toward the lower position (-0 == +0);
//     -inf is an ordinary, smallest score;
//   - the selected positions come first in ascending order, then -1 up to k.
// So a row shorter than k (without NaN) gives 0..L-1 then -1. nvcc-safe.
#pragma once

#include <cstdint>

#include "kvpool/model/model_limits.h"  // kMaxTopk

namespace kvp {

struct TopkParams {
  const float* scores = nullptr;     // [num_rows, scores_stride]
  const int32_t* lengths = nullptr;  // [num_rows]; each <= scores_stride
  int32_t* indices = nullptr;        // [num_rows, k], int32, -1 = none
  int32_t scores_stride = 0;
  int32_t num_rows = 0;
  int32_t k = 0;  // 1..kMaxTopk
};

}  // namespace kvp
