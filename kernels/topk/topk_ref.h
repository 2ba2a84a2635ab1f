// CPU reference of top-k (the contract in topk_params.h).
#pragma once

#include "absl/status/status.h"
#include "kernels/topk/topk_params.h"

namespace kvp {

absl::Status TopkRef(const TopkParams& p);

}  // namespace kvp
