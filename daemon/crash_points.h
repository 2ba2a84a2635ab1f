// Crash points: kvpoold kills itself with SIGKILL at a chosen step, so that tests can check what
// a restart keeps (docs/design.md §10) at every step of every request kind. Never set in
// production; --crash_at is for tests and says so.
//
// A point is STEP:KIND:N, the N-th time (from 1) that kvpoold
//   receive:KIND  has parsed a message of body KIND (prefill, decode, jobDone, ...),
//   log:KIND      has logged the changes of handling one (KIND tick: of a tick),
//   send:KIND     has sent a message of body KIND (prefillJob, prefillReply, error, ...).
// KIND * matches every kind. Body kinds are the schema's field names (protocol/kvpool.capnp).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvp {

class CrashPoint {
 public:
  // An empty spec: never. INVALID_ARGUMENT for anything but STEP:KIND:N.
  static absl::StatusOr<CrashPoint> Parse(absl::string_view spec);

  // Counts one step; SIGKILLs the process when it is the chosen one.
  void Reached(absl::string_view step, absl::string_view kind);

 private:
  std::string step_, kind_;
  int64_t remaining_ = 0;  // 0: never
};

}  // namespace kvp
