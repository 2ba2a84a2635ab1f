// What a worker serves (kernels/capabilities.h) <-> wire, and whether it covers a pool: kvpoold
// refuses a worker that would fail the pool's jobs.
#pragma once

#include "absl/status/status.h"
#include "kvpool/format/op_capabilities.h"
#include "kvpool/layout/pool_spec.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

void ServedToWire(const OpCapabilities& served, wire::ServedFormats::Builder out);
// Formats the wire names that this build does not know are left out.
OpCapabilities ServedFromWire(wire::ServedFormats::Reader in);

// OK when `served` covers the spec's K and V formats and head dim (an MLA pool: MLA); UNIMPLEMENTED
// naming the first it lacks.
absl::Status CheckServes(const OpCapabilities& served, const PoolSpec& spec);

}  // namespace kvp
