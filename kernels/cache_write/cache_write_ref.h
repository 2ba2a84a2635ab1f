// CPU reference of the cache write: the bytes every implementation must produce.
#pragma once

#include "absl/status/status.h"
#include "kernels/cache_write/cache_write_params.h"

namespace kvp {

// Writes the addressed slots and nothing else. OUT_OF_RANGE for a slot outside the arena,
// INVALID_ARGUMENT for missing inputs; nothing is written when an error is returned.
absl::Status CacheWriteRef(const CacheWriteParams& p);

}  // namespace kvp
