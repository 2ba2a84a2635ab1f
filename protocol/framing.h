// Envelopes as ZeroMQ multipart messages (docs/design.md §6): one frame per Cap'n Proto segment.
//
// Sending is zero-copy: the frames point into the builder's segments, and the builder lives until
// ZeroMQ has released the last of them. Reading enforces WireLimits before and while it reads:
// frame count, sizes (whole words), total size, traversal and nesting limits. A frame whose data
// is not 8-byte aligned is copied, never read in place. The whole message is traversed at parse
// time, generically and then as the schema types it (message_check.h), so a malformed message is
// refused there with a Status, never an exception later.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <memory>
#include <vector>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "protocol/kvpool.capnp.h"
#include "protocol/wire_limits.h"

namespace kvp {

// An Envelope under construction: schema version and request id already set.
class EnvelopeBuilder {
 public:
  explicit EnvelopeBuilder(uint64_t request_id);
  wire::Envelope::Builder envelope() { return root_; }
  wire::Envelope::Reader reader() const { return root_.asReader(); }
  uint64_t request_id() const { return reader().getRequestId(); }
  // Stamps the epoch a sender last heard from (requests) or its own (replies) as the message
  // goes out; the builder is a handle on the message, so this is allowed on a const one.
  void set_epoch(uint64_t epoch) const {
    wire::Envelope::Builder root = root_;
    root.setEpoch(epoch);
  }

  // The frames to send, pointing into the builder's segments, which live until the builder and
  // every frame made from it are gone. Framing again re-sends the same message (a re-queued job);
  // do not change the envelope while frames of it are in flight.
  std::vector<zmq::message_t> Frame() const;

 private:
  std::shared_ptr<capnp::MallocMessageBuilder> message_;
  wire::Envelope::Builder root_;
};

// A received Envelope and the memory it reads from.
class ParsedEnvelope {
 public:
  wire::Envelope::Reader envelope() const { return root_; }
  uint64_t request_id() const { return root_.getRequestId(); }

 private:
  friend absl::StatusOr<std::unique_ptr<ParsedEnvelope>> ParseEnvelope(
      std::vector<zmq::message_t> frames, const WireLimits& limits, uint64_t* request_id);
  ParsedEnvelope() = default;

  std::vector<zmq::message_t> frames_;
  std::vector<std::unique_ptr<capnp::word[]>> copies_;  // aligned copies of misaligned frames
  std::vector<kj::ArrayPtr<const capnp::word>> segments_;
  std::unique_ptr<capnp::SegmentArrayMessageReader> reader_;
  wire::Envelope::Reader root_;
};

// INVALID_ARGUMENT for anything that is not a well-formed Envelope within `limits` (the message
// says which limit or which part), including every field CheckEnvelope (message_check.h) refuses:
// a parsed envelope reads without exceptions. FAILED_PRECONDITION for another schema version. When
// the envelope was readable, *request_id (if given) is its request id even on error, so the error
// reply can carry it; otherwise 0.
// The schema's name of a body kind ("prefill", "prefillReply", "jobDone", ...), for logs and
// tests; "unknown" for a kind this build does not know.
const char* BodyFieldName(wire::Envelope::Body::Which which);

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> ParseEnvelope(std::vector<zmq::message_t> frames,
                                                              const WireLimits& limits = {},
                                                              uint64_t* request_id = nullptr);

}  // namespace kvp
