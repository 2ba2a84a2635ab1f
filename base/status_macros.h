// Status propagation macros under their upstream names (RETURN_IF_ERROR, ASSIGN_OR_RETURN).
// Debian's Abseil 20220623 ships neither; drop this file once Abseil provides them.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVP_STATUS_CONCAT_INNER(a, b) a##b
#define KVP_STATUS_CONCAT(a, b) KVP_STATUS_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status kvp_status_ = (expr);       \
    if (!kvp_status_.ok()) return kvp_status_; \
  } while (0)

// `lhs` = value of the StatusOr `rexpr`, or returns its status from the enclosing function.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  KVP_ASSIGN_OR_RETURN_IMPL(KVP_STATUS_CONCAT(kvp_statusor_, __LINE__), lhs, rexpr)

#define KVP_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()
