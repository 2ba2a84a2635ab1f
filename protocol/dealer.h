// A DEALER socket to kvpoold: what workers and clients talk through. Send frames an Envelope;
// Receive parses one within the wire limits; Call does both and waits for the reply carrying the
// same request id, turning an error reply into its Status.
//
// Nobody waits on a dead kvpoold: the dealer watches its connection (a ZeroMQ socket monitor)
// and the epoch every kvpoold message carries. When the connection drops while a reply is
// awaited, or a message from another kvpoold epoch arrives before the reply to a request sent
// to the old one, the wait ends at once with UNAVAILABLE naming the restart.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "protocol/curve.h"
#include "protocol/framing.h"
#include "protocol/wire_limits.h"

namespace kvp {

class Dealer {
 public:
  // Connects (lazily, as ZeroMQ does) to `endpoint` with routing id `identity` (empty: random);
  // with `curve`, as a CURVE client (kvpoold's tcp:// endpoint).
  Dealer(zmq::context_t& context, const std::string& endpoint, const std::string& identity,
         const CurveClientKeys* curve = nullptr);
  ~Dealer();
  Dealer(const Dealer&) = delete;
  Dealer& operator=(const Dealer&) = delete;

  // With keep-alive (> 0), a wait heartbeats kvpoold every `millis` (a client heartbeat, lease 0,
  // request id 0) and drops the heartbeat replies, so a client waiting for a long job keeps its
  // lease. 0 (the default): no heartbeats.
  void set_keep_alive_ms(int millis) { keep_alive_ms_ = millis; }
  // What received messages are checked against (a worker narrows them to its pool's).
  void set_limits(const WireLimits& limits) { limits_ = limits; }

  // The epoch of the kvpoold last heard from (0 before the first message), also after the
  // connection to it dropped: requests carry it, so that a restarted kvpoold can say that a
  // sequence was lost with its predecessor.
  uint64_t epoch() const { return epoch_; }

  // Stamps epoch() on the message. UNAVAILABLE when it cannot be queued within the send timeout.
  absl::Status Send(const EnvelopeBuilder& message);
  // DEADLINE_EXCEEDED when nothing arrives within timeout_ms; CANCELLED when a signal interrupts
  // the wait; UNAVAILABLE when the connection to kvpoold drops meanwhile; INVALID_ARGUMENT for a
  // malformed message.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Receive(int timeout_ms);
  // The reply to `message`: an error reply becomes its Status; replies to other request ids (left
  // over from calls that timed out) are dropped. DEADLINE_EXCEEDED after timeout_ms; UNAVAILABLE
  // as soon as kvpoold is seen to stop or restart before replying.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Call(const EnvelopeBuilder& message,
                                                       int timeout_ms);

  zmq::socket_t& socket() { return socket_; }

 private:
  // One wait for a message or a dropped connection, no keep-alive.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> ReceiveOnce(int timeout_ms);
  // Drops connection events already queued (from before a call): they concern earlier requests.
  void DropStaleEvents();

  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // PAIR: the socket monitor's disconnect events
  bool curve_ = false;
  int keep_alive_ms_ = 0;
  uint64_t epoch_ = 0;
  bool reconnecting_ = false;  // the connection dropped: the next epoch heard is adopted quietly
  WireLimits limits_;
};

}  // namespace kvp
