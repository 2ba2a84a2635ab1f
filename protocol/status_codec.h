// absl::Status <-> the wire Error: the one place codes cross the protocol boundary.
#pragma once

#include "absl/status/status.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

void StatusToWire(const absl::Status& status, wire::Error::Builder error);

// The status a wire Error carries; an unknown code number becomes UNKNOWN.
absl::Status StatusFromWire(wire::Error::Reader error);

}  // namespace kvp
