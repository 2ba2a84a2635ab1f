// The C++ client of kvpoold (docs/design.md §6): synchronous calls for every request, plus Send and
// Receive for callers that keep many requests in flight (kvpoolctl bench).
//
// A client's sequences belong to its lease, which kvpoold keys by the client's name (its ZeroMQ
// routing id): two Client objects with the same name share sequences, and a reconnecting client
// takes its name over. The lease lives while requests or Heartbeat calls keep coming (kvpoold's
// --client_lease_ms). Errors are kvpoold's typed statuses; UNAVAILABLE or DEADLINE_EXCEEDED when it
// does not answer within the timeout, and at once when the connection to kvpoold drops or kvpoold
// restarts while a reply is awaited (requests in flight then were lost).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "kvpool/layout/pool_spec.h"
#include "protocol/activations_codec.h"
#include "protocol/dealer.h"
#include "protocol/outputs_codec.h"
#include "protocol/spec_codec.h"
#include "protocol/transport_names.h"

namespace kvp {

struct ClientOptions {
  std::string endpoint;  // default: ipc://<DefaultRuntimeDir()>/kvpoold.sock
  std::string name;      // default: unique per process
  int timeout_ms = 120'000;
  // How often a client waiting for a reply heartbeats: well inside kvpoold's client lease (30 s
  // by default), so a long job does not outlive the lease of the client waiting for it.
  int keep_alive_ms = 5000;
  // For kvpoold's tcp:// endpoint, which admits CURVE clients whose public key it lists.
  std::optional<CurveClientKeys> curve;
  // The cache namespace of this client's prefills and appends (vLLM's cache_salt): blocks are
  // shared as prefix hits only inside one namespace. Empty: the default one.
  std::string cache_namespace;
};

// Where a prefill runs and where its sequence is decoded (kvpoold's pools, one per GPU): -1 lets
// kvpoold place a new sequence, and keeps it where it was prefilled.
struct Placement {
  int32_t pool = -1;
  int32_t decode_pool = -1;
  // The node decode_pool is a pool of (a peer kvpoold's name, docs/design.md §11); empty: this
  // kvpoold's. The sequence moves there once written and is decoded there through this kvpoold.
  std::string decode_node = "";
  // With a decode pool elsewhere: written in slices of this many tokens, each slice's blocks moved
  // while the next is written (-1: kvpoold's --prefill_chunk_tokens; 0: whole, moved after).
  int32_t chunk_tokens = -1;
  // With a decode pool: more prefills of this sequence follow (an engine's chunked prefill); its
  // blocks stream there as they fill, and the last prefill (not continued) moves it.
  bool continued = false;
};

// A pool, possibly of another node: "1" (this kvpoold's pool 1) or "b/1" (pool 1 of peer node b,
// docs/design.md §11). ParsePoolAddress takes either; INVALID_ARGUMENT for anything else.
struct PoolAddress {
  std::string node;  // empty: the kvpoold asked
  int32_t pool = -1;
};
absl::StatusOr<PoolAddress> ParsePoolAddress(absl::string_view text);

// How a sequence moved between pools.
struct MigrationResult {
  uint32_t from_pool = 0, to_pool = 0;
  std::string to_node = "";  // to_pool's node; empty: the kvpoold asked
  wire::Transport transport = wire::Transport::NONE;
  uint32_t blocks_moved = 0;   // copied
  uint32_t blocks_shared = 0;  // the destination held them already
  uint64_t bytes = 0;
  uint64_t micros = 0;
  uint32_t streamed_blocks = 0;     // of blocks_moved, those moved while the prefill was written
  uint64_t after_prefill_micros = 0;  // a prefill's: from its last write to decode-ready
  int64_t length = 0;          // the sequence's tokens (Migrate)
  absl::Status error;          // a prefill's move that failed: the sequence stays on from_pool
};

struct PrefillResult {
  int64_t length = 0;
  int32_t prefix_hit_tokens = 0;
  uint32_t pool = 0;                         // where the sequence lives now
  std::string node = "";                     // on which node; empty: the kvpoold asked
  std::optional<MigrationResult> migration;  // with a decode pool other than the prefill's
};

struct NeedleSpec {
  int64_t position = 0;
  int32_t token = 0;  // the token at `position`
  float gain = 0.35f;
};

struct DecodeStepRequest {
  uint64_t sequence = 0;
  int32_t token = 0;
  std::optional<NeedleSpec> needle;             // synthetic queries only
  const TokenActivations* activations = nullptr;  // the new token's K/V; null: synthetic
  const StepQueries* queries = nullptr;           // null: synthetic
};

struct DecodeResult {
  std::vector<DecodeStepResult> steps;
  uint64_t worker_micros = 0;         // the worker executing the job (kernels included)
  uint64_t worker_handle_micros = 0;  // the worker from receiving the job to its report
  uint64_t broker_micros = 0;         // kvpoold handling the request and the report
};

struct AppendResult {
  int32_t prefix_hit_tokens = 0;
  std::vector<int64_t> slots;
  std::vector<std::pair<int32_t, int32_t>> copies;
  std::vector<int32_t> block_table;
  uint32_t pool = 0;  // whose arena the slots are in
};

// One of kvpoold's pools.
struct PoolState {
  uint32_t index = 0;
  int32_t gpu = -1;  // -1: host
  uint64_t blocks_free = 0, blocks_reserved = 0, blocks_used = 0, blocks_cached = 0;
  uint32_t sequences = 0;
  uint32_t prefill_workers = 0, decode_workers = 0;
};

struct PoolStats {
  uint64_t blocks_free = 0, blocks_reserved = 0, blocks_used = 0, blocks_cached = 0;
  uint64_t prefix_hit_blocks = 0;  // this client's
  uint32_t leases = 0, sequences = 0;
  uint64_t client_blocks = 0;               // what this client holds, against its limits
  uint32_t client_requests_in_flight = 0;
  uint64_t rejected_nonfinite = 0;          // requests refused for NaN or Inf, all clients
  std::vector<PoolState> pools;              // the counts above are their sums
  // What kvpoold's last start kept from its state log (docs/design.md §10).
  struct Recovery {
    bool state_dir = false;  // kvpoold logs its state
    uint64_t sequences = 0, blocks = 0, micros = 0;
  } recovery;
  // The other nodes' kvpoolds, and this client's sequences that live there (docs/design.md §11).
  struct Peer {
    std::string name, endpoint;
    bool reachable = false;
    uint64_t last_heard_millis = 0;
    uint32_t sequences = 0;
  };
  std::vector<Peer> peers = {};
  struct RemoteSequence {
    uint64_t sequence = 0;
    std::string node;
    uint32_t pool = 0;
  };
  std::vector<RemoteSequence> remote_sequences = {};
};

struct PoolHealth {
  bool ready = false;
  bool draining = false;
  uint64_t epoch = 0;
  uint32_t workers = 0;
  PoolSpec spec;
  ModelConfig model;
  uint64_t client_max_blocks = 0;  // what one client may hold (0: no limit)
  uint32_t client_max_requests = 0;  // prefill and decode requests one client may have in flight
  std::vector<PoolState> pools;
};

class Client {
 public:
  explicit Client(ClientOptions options);

  absl::StatusOr<PoolHealth> Health();
  absl::StatusOr<PoolStats> Stats();
  absl::Status Heartbeat();

  // Writes `tokens` (appended when the sequence exists). Without activations the synthetic model
  // makes them; with them, `spec` is the pool's (Health().spec).
  absl::StatusOr<PrefillResult> Prefill(uint64_t sequence, std::span<const int32_t> tokens,
                                        const TokenActivations* activations = nullptr,
                                        const PoolSpec* spec = nullptr, Placement placement = {});
  // Moves an idle sequence to another pool (rebalancing); it is decoded there from then on.
  // `to_node`: a peer kvpoold's node name (docs/design.md §11); empty: a pool of this kvpoold.
  absl::StatusOr<MigrationResult> Migrate(uint64_t sequence, uint32_t to_pool,
                                          const std::string& to_node = "");
  absl::StatusOr<DecodeResult> Decode(const std::vector<DecodeStepRequest>& steps,
                                      wire::OutputLayers outputs = wire::OutputLayers::ALL,
                                      const PoolSpec* spec = nullptr,
                                      const ModelConfig* model = nullptr);
  absl::StatusOr<uint32_t> Release(uint64_t sequence);
  absl::StatusOr<uint32_t> Fork(uint64_t source, uint64_t target);

  // Engine attachments: reserve slots, write them yourself, then commit or abort.
  // `pool`: the pool whose arena the engine attached (-1: where the sequence lives, or pool 0).
  absl::StatusOr<AppendResult> Append(uint64_t sequence, std::span<const int32_t> tokens,
                                      int32_t pool = -1);
  absl::StatusOr<int64_t> Commit(uint64_t sequence);
  absl::StatusOr<int64_t> Abort(uint64_t sequence);

  // Asynchronous use: a fresh request, sent; replies come back through Receive in any order.
  EnvelopeBuilder NewRequest() { return EnvelopeBuilder(next_id_++); }
  absl::Status Send(const EnvelopeBuilder& request) { return dealer_.Send(request); }
  // The next reply. While it waits, it heartbeats every options().keep_alive_ms.
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Receive(int timeout_ms) {
    return dealer_.Receive(timeout_ms);
  }

  // Request builders, shared by the synchronous calls and asynchronous users.
  static void BuildPrefill(EnvelopeBuilder& request, uint64_t sequence,
                           std::span<const int32_t> tokens, const TokenActivations* activations,
                           const PoolSpec* spec, const std::string& cache_namespace = "",
                           Placement placement = {});
  static void BuildDecode(EnvelopeBuilder& request, const std::vector<DecodeStepRequest>& steps,
                          wire::OutputLayers outputs, const PoolSpec* spec,
                          const ModelConfig* model);

  const ClientOptions& options() const { return options_; }

 private:
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Call(const EnvelopeBuilder& request);

  ClientOptions options_;
  zmq::context_t context_;
  Dealer dealer_;
  uint64_t next_id_ = 1;
};

// The reply to a prefill or decode request, or its error.
absl::StatusOr<PrefillResult> PrefillResultOf(const ParsedEnvelope& reply);
absl::StatusOr<MigrationResult> MigrationResultOf(const ParsedEnvelope& reply);
absl::StatusOr<DecodeResult> DecodeResultOf(const ParsedEnvelope& reply);

}  // namespace kvp
