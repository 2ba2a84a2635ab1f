// The last line of the boundary (docs/design.md §7): a handler run under RunGuarded cannot take its
// process down. Messages are checked before handlers read them (message_check.h), and handlers
// return Status; this catches what slips past both (a kj::Exception from a read, std::bad_alloc,
// a bad StatusOr's value()) and turns it into INTERNAL for that one request.
#pragma once

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace kvp {

// `handler`'s status, or INTERNAL naming the exception it threw. Never throws.
absl::Status RunGuarded(absl::FunctionRef<absl::Status()> handler);

}  // namespace kvp
