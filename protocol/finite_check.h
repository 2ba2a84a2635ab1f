// Bad values are refused, not computed with (docs/design.md §7): NaN or Inf in a client's tensors
// would be stored (E4M3 keeps NaN) and poison every later decode that selects the position.
#pragma once

#include "absl/status/status.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

// INVALID_ARGUMENT naming the first non-finite value: its tensor, layer and position (for
// example "v of layer 2 at [5, 3, 17] is NaN"). REQUIRES: the tensors passed CheckActivations /
// CheckQueries (dtypes and shapes as the pool's).
absl::Status CheckFinite(wire::Activations::Reader in);
absl::Status CheckFinite(wire::Queries::Reader in);

}  // namespace kvp
