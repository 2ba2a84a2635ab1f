// An in-process kvpoold for the fuzz targets: a small pool under a fake clock, the Broker that
// kvpoold runs, and helpers to speak to it as clients and workers do. Each instance is fresh.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/broker.h"
#include "kvpool/pool/clock.h"
#include "kvpool/pool/pool_set.h"

namespace kvp::fuzz {

// The pool the targets fuzz: small, so that full pools, evictions and limits are reached.
PoolSpec FuzzPoolSpec();  // 2 layers, 2 kv heads of 64, blocks of 16, indexer, turbo3 V
ModelConfig FuzzModel();  // 4 q heads, top-32
inline constexpr int kFuzzBlocks = 48;  // per pool
inline constexpr int kFuzzPools = 2;    // host pools, so that migrations are reached

class FuzzService {
 public:
  // `transport`: how migrations move (BrokerOptions::transport); nullopt: host copies. `peers`:
  // this kvpoold is node "a" with one peer, node "b" (its link kLinkPrefix + "b").
  explicit FuzzService(std::optional<wire::Transport> transport = std::nullopt,
                       bool peers = false);

  // Hands one message to the broker as kvpoold's loop would; the messages it sends back.
  Outbox Send(const std::string& from, std::vector<zmq::message_t> frames);
  Outbox Send(const std::string& from, const EnvelopeBuilder& message);
  Outbox Tick(int64_t advance_micros);

  // Registers a worker of `role` for `pool` under `identity`; the broker's replies.
  Outbox Register(const std::string& identity, wire::Role role, int32_t pool = 0);

  // Every pool's invariants (the tables against the allocator) and one home per sequence.
  absl::Status Check() const { return pools_->CheckInvariants(); }

  PoolSet& pools() { return *pools_; }
  Broker& broker() { return *broker_; }

 private:
  FakeClock clock_;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<Broker> broker_;
};

// The envelopes of `out` to peer `to` (all when empty), parsed; aborts if one does not parse:
// everything kvpoold sends must be a well-formed message.
std::vector<std::unique_ptr<ParsedEnvelope>> Replies(Outbox& out, const std::string& to = "");

// A prefill of `tokens` consecutive ids from `first`, synthetic.
EnvelopeBuilder SyntheticPrefill(uint64_t id, uint64_t seq, int tokens, int32_t first);

// `bytes` as frames of a ZeroMQ multipart message: `segments` frames of about equal size.
std::vector<zmq::message_t> FramesOf(const std::string& bytes, int segments);

// Aborts (a fuzzer finding) with `what` when `status` is not OK.
void CheckOrDie(const absl::Status& status, const char* what);

}  // namespace kvp::fuzz
