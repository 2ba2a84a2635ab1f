// A DEALER socket to kvpoold: what workers and clients talk through. Send frames an Envelope;
// Receive parses one within the wire limits; Call does both and waits for the reply carrying the
// same request id, turning an error reply into its Status.
#pragma once

#include <memory>
#include <string>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "protocol/curve.h"
#include "protocol/framing.h"

namespace kvp {

class Dealer {
 public:
  // Connects (lazily, as ZeroMQ does) to `endpoint` with routing id `identity` (empty: random);
  // with `curve`, as a CURVE client (kvpoold's tcp:// endpoint).
  Dealer(zmq::context_t& context, const std::string& endpoint, const std::string& identity,
         const CurveClientKeys* curve = nullptr);

  // With keep-alive (> 0), a wait heartbeats kvpoold every `millis` (a client heartbeat, lease 0,
  // request id 0) and drops the heartbeat replies, so a client waiting for a long job keeps its
  // lease. 0 (the default): no heartbeats.
  void set_keep_alive_ms(int millis) { keep_alive_ms_ = millis; }

  // UNAVAILABLE when the message cannot be queued within the send timeout.
  absl::Status Send(const EnvelopeBuilder& message);
  // DEADLINE_EXCEEDED when nothing arrives within timeout_ms; CANCELLED when a signal interrupts
  // the wait; INVALID_ARGUMENT for a malformed message.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Receive(int timeout_ms);
  // The reply to `message`: an error reply becomes its Status; replies to other request ids (left
  // over from calls that timed out) are dropped. DEADLINE_EXCEEDED after timeout_ms.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Call(const EnvelopeBuilder& message,
                                                       int timeout_ms);

  zmq::socket_t& socket() { return socket_; }

 private:
  // One blocking receive, no keep-alive.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> ReceiveOnce(int timeout_ms);

  zmq::socket_t socket_;
  bool curve_ = false;
  int keep_alive_ms_ = 0;
};

}  // namespace kvp
