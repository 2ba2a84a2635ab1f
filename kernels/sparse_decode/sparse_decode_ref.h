// CPU reference of sparse decode.
#pragma once

#include "absl/status/status.h"
#include "kernels/sparse_decode/sparse_decode_params.h"

namespace kvp {

// OUT_OF_RANGE for an index outside [-1, seq_len), INVALID_ARGUMENT for a repeated index.
absl::Status SparseDecodeRef(const SparseDecodeParams& p);

}  // namespace kvp
