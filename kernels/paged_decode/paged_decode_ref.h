// CPU reference of dense paged decode.
#pragma once

#include "absl/status/status.h"
#include "kernels/paged_decode/paged_decode_params.h"

namespace kvp {

absl::Status PagedDecodeRef(const PagedDecodeParams& p);

}  // namespace kvp
