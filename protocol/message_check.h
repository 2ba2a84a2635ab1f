// The schema-driven check every received Envelope passes before a handler reads it (docs/design.md
// §6, docs/protocol.md): what Cap'n Proto's own traversal does not catch.
//
// Cap'n Proto validates pointers lazily and throws (kj::Exception) when a handler reads a field
// whose pointer is of the wrong kind, or a list whose zero-byte elements claim a huge count. This
// check reads every field the schema names, as the schema types it, once, under the message's
// traversal limit, so that after it succeeds every typed read a handler makes succeeds too:
//   1. every pointer is of the kind its field declares (struct, list of the declared element
//      size, text, data);
//   2. every List field, and every Text field that names one, is within the bound its schema
//      annotation gives ($maxElements, or $boundBy a dimension of the receiver's pool);
//   3. every enum holds a value the schema lists, every union a member the schema lists.
// It never walks fields the schema does not name. Thread-compatible; no state.
#pragma once

#include <capnp/schema.h>

#include <cstdint>

#include "absl/status/status.h"
#include "protocol/kvpool.capnp.h"
#include "protocol/wire_limits.h"

namespace kvp {

// INVALID_ARGUMENT naming the field path (for example "body.decode.steps[3].queries.q") and what
// is wrong. Never throws.
absl::Status CheckEnvelope(wire::Envelope::Reader envelope, const WireLimits& limits);

// For tests: the bound `field`'s schema annotation gives under `limits`; 0 when it names none.
uint64_t TEST_ListBound(const capnp::StructSchema::Field& field, const WireLimits& limits);

}  // namespace kvp
