// Messages of a few dozen bytes that pass the size checks but whose typed reads would throw: what
// an independent client sent to take kvpoold down. Shared by the ipc and the CURVE tcp tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "protocol/dealer.h"

namespace kvp::testing {

struct MalformedMessage {
  std::string what;
  std::vector<std::string> frames;  // one per segment, as a peer sends them
};

// A prefill whose token list is a struct, a decode with 2^28 zero-byte steps, a register with a
// role no schema has, a heartbeat whose union member does not exist. Request id 9 each.
std::vector<MalformedMessage> MalformedMessages();

// Sends `m` on `dealer` and waits for kvpoold's answer: OK when it is an INVALID_ARGUMENT error
// reply to request 9, else what was wrong.
absl::Status ExpectRefused(Dealer& dealer, const MalformedMessage& m);

}  // namespace kvp::testing
