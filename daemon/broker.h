// The Broker: kvpoold's request logic, apart from sockets and threads (docs/design.md §6, §7).
//
// It owns no memory: it plans appends on the pools, sends jobs to workers, commits on success,
// aborts on failure and answers clients. kvpoold has one pool per GPU (or --pools memfd pools);
// a worker serves one pool, a sequence lives in one, and migrations move it between them. Every message in is one Handle call, every message out
// an Outgoing; the daemon's loop moves them between the ROUTER socket and the broker, and tests
// drive it directly.
//
// Ownership of blocks, so that none is lost or handed out twice:
//   - a sequence and its pending append belong to the client's lease (one per ROUTER identity,
//     renewed by every request and by heartbeats); workers hold no blocks;
//   - a job names the sequences it writes; they are "busy" until it ends, and nothing else
//     (release, fork, commit, another job) touches a busy sequence;
//   - a worker whose lease expires gives its job back: re-queued to another worker of its role
//     (up to max_job_attempts), or failed to the client with ABORTED and its append aborted;
//   - a client whose lease expires loses its sequences; blocks a running job is writing are
//     returned only when that job ends, so no worker writes into a block given to someone else;
//   - a migration is a job of the destination pool: its blocks are reserved there under the
//     sequence's lease (a pending Import), committed when the receiving worker reports them and
//     only then released on the source; on failure the reservation is aborted and the source,
//     never changed, stays the sequence's home.
// Not thread-safe: one loop owns it. broker.cc holds the request handlers, broker_jobs.cc the
// leases and jobs, broker_migrations.cc placement and migrations.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "daemon/metrics.h"
#include "daemon/peers.h"
#include "kvpool/pool/clock.h"
#include "kvpool/pool/pool_set.h"
#include "protocol/block_tables.h"
#include "protocol/content_digest.h"
#include "protocol/framing.h"
#include "protocol/spec_codec.h"
#include "protocol/wire_limits.h"

namespace kvp {

inline constexpr size_t kMaxPrefillTokens = wire::MAX_PREFILL_TOKENS;
inline constexpr size_t kMaxDecodeSteps = wire::MAX_DECODE_STEPS;

struct BrokerOptions {
  ModelConfig model;
  // Per pool: its GPU (-1: a host memfd pool) and the fd channel its workers fetch it from. Pools
  // without an entry (tests of the bookkeeping alone) are host pools without a channel.
  std::vector<int32_t> pool_gpus = {-1};
  std::vector<std::string> fd_channel_paths = {""};
  // Per pool: its arena's chunk size (paired moves never send across a chunk boundary); pools
  // without an entry have kvpoold's host chunk size, 64 MiB.
  std::vector<uint64_t> pool_chunk_bytes;
  // How migrations move their bytes: nullopt picks per move (host pools: host; one GPU or peer
  // access: peer copy; else NCCL); a transport named here is used for every move, and a move it
  // cannot make is refused (UNIMPLEMENTED). Paired moves (nccl, socket) must end in this time,
  // the rendezvous included.
  std::optional<wire::Transport> transport;
  int transfer_timeout_millis = 20'000;
  int heartbeat_millis = 1000;                 // what workers are told to use
  int64_t worker_lease_micros = 3'000'000;     // the pool's lease expiry, told to workers
  int64_t client_lease_micros = 30'000'000;    // clients' sequences outlive short pauses
  uint64_t epoch = 0;                          // changes with every kvpoold start
  int max_job_attempts = 2;
  // A prefill with a decode pool elsewhere is written in slices of this many tokens, each one's
  // full blocks streamed there while the next is written (PrefillRequest.chunkTokens); 0: whole.
  int prefill_chunk_tokens = 8192;
  WireLimits limits;
  // Fair use, per client lease: blocks its sequences and reservations hold (0: no limit) and
  // prefill and decode requests queued or running. RESOURCE_EXHAUSTED names the limit passed.
  int64_t client_max_blocks = 0;
  int client_max_requests = 256;
  bool allow_nonfinite = false;  // tests only: NaN and Inf in client tensors are stored as sent
  // The content digest key (protocol/content_digest.h); none: a fresh one. A kvpoold that
  // recovered its pools passes the key they were written under, so their blocks stay findable.
  std::optional<ContentDigester::Key> digest_key;
  // Across nodes (docs/design.md §11): this kvpoold's node name and the other nodes' kvpoolds,
  // reached through the daemon loop's links (kLinkPrefix) and admitted on its tcp endpoint as
  // peers (kPeerPrefix). No peers: one node.
  std::string node_name;
  std::vector<PeerNode> peers;
};

// A peer is named by the endpoint it came through and its routing id, so that no remote client
// can take a local peer's name (or its sequences) and no routing id can pass for the other
// endpoint's; workers must be local (they attach memory through the fd channel), so a remote
// Register is refused.
inline constexpr absl::string_view kLocalPeerPrefix = "ipc/";
inline constexpr absl::string_view kRemotePeerPrefix = "tcp/";
// Across nodes (docs/design.md §11): another node's kvpoold on the tcp endpoint, authenticated by
// its listed CURVE key, is "peer/NAME/" and its routing id; this kvpoold's own link to peer NAME
// (a DEALER of the daemon loop) is "link/NAME".
inline constexpr absl::string_view kPeerPrefix = "peer/";
inline constexpr absl::string_view kLinkPrefix = "link/";
inline bool IsRemotePeer(absl::string_view peer) {
  return absl::StartsWith(peer, kRemotePeerPrefix) || absl::StartsWith(peer, kPeerPrefix);
}

// One message to send on the ROUTER socket: to whom, and its frames.
struct Outgoing {
  std::string to;
  std::vector<zmq::message_t> frames;
  const char* kind = "";  // its body's name (BodyFieldName): for logs and crash points
};
using Outbox = std::vector<Outgoing>;

class Broker {
 public:
  // REQUIRES: pools and clock outlive the broker.
  Broker(PoolSet* pools, const Clock* clock, BrokerOptions options);

  // One message from the ROUTER peer `from`. Every request gets exactly one reply (now, or when
  // its job ends), carrying this kvpoold's epoch; bad input gets an error reply naming what is
  // wrong. Never throws: a handler's failure is that request's INTERNAL error and a log line.
  // Returns the message's body kind (BodyFieldName; "malformed" when it did not parse).
  const char* Handle(const std::string& from, std::vector<zmq::message_t> frames, Outbox& out);
  // Called with a message's body kind once it has parsed, before it is handled (crash points).
  void set_receive_hook(std::function<void(const char* kind)> hook) {
    receive_hook_ = std::move(hook);
  }

  // Reaps expired leases (re-queuing or failing their jobs) and dispatches queued jobs.
  void Tick(Outbox& out);

  // From now on new prefill, decode and append requests get UNAVAILABLE; jobs in flight finish.
  void StartDrain() { draining_ = true; }
  bool draining() const { return draining_; }
  // Why kvpoold does not serve every request yet: draining, or a pool without a prefill or a
  // decode worker (the first one). Empty when it serves: what /readyz reports.
  std::string NotReady() const;
  bool Idle() const { return jobs_.empty(); }

  std::string MetricsText() const;
  const ContentDigester::Key& digest_key() const { return digester_.key(); }
  // What the last start recovered (kvpoold's state log), for Stats and /metrics.
  struct Recovered {
    uint64_t sequences = 0;
    uint64_t blocks = 0;
    uint64_t micros = 0;
  };
  void set_recovered(const Recovered& recovered) { recovered_ = recovered; }
  // After a restart (docs/design.md §10): the blocks a job of the last kvpoold may still be writing
  // are held by `lease` (Pool::Restore's quarantine) until every worker process in `pids` has
  // registered again (its old job is over) or exited, or the lease expires.
  void SetQuarantine(LeaseId lease, std::vector<uint32_t> pids);
  size_t num_workers() const { return workers_.size(); }
  const BrokerOptions& options() const { return options_; }

 private:
  using JobId = uint64_t;
  enum class Role { kPrefill = 0, kDecode = 1 };
  static const char* RoleName(Role role) { return role == Role::kPrefill ? "prefill" : "decode"; }
  // A job is run by a worker of its pool: prefill and decode jobs by one of that role, a
  // migration by any (it only copies blocks).
  enum class JobKind { kPrefill = 0, kDecode = 1, kMigrate = 2 };
  static constexpr int kJobKinds = 3;
  static const char* KindName(JobKind kind);
  // What a migration is moving, and whom to tell how it went.
  struct Migration {
    PoolIndex from = 0;
    PoolIndex to = 0;
    wire::Transport transport = wire::Transport::NONE;
    uint32_t blocks_moved = 0;
    uint32_t blocks_shared = 0;
    int64_t started_micros = 0;
    bool after_prefill = false;  // answer with a PrefillReply (its prefix hits in the job)
    // A prefill's move: when its last write was reported, and what its stream copied before.
    int64_t prefill_end_micros = 0;
    uint32_t blocks_streamed = 0;
    uint64_t bytes_streamed = 0;
    // Paired moves: the sending worker of the source pool (0 until dispatched), the link between
    // it and the receiver, and whether the send job went out.
    LeaseId sender = 0;
    uint64_t link = 0;
    bool fresh_link = true;
    std::string token = {};
    bool send_sent = false;
    // Across nodes (broker_peers.cc). Sending side: the peer node `to` is a pool of. Receiving
    // side: the peer kvpoold that sends (its identity), its request, its arena's chunk size.
    std::string to_node = {};
    std::string from_peer = {};
    uint64_t peer_call = 0;
    uint64_t peer_chunk_bytes = 0;
  };
  // A prefill written in slices: its job is sent once per slice (docs/design.md §6).
  struct PrefillSlices {
    EnvelopeBuilder whole{0};  // the PrefillJob of every token
    uint32_t written = 0;   // its tokens written by the slices before the one sent
    uint32_t size = 0;      // tokens per slice
  };
  // A sequence whose full blocks are copied to its decode pool while later tokens are written:
  // by the slices of a prefill, or by an engine's later (continued) prefills. Its blocks are
  // staged there under the sequence's lease; the final move's Import takes them. One stream move
  // is in flight at a time; a final prefill's end waits for it (parked), so that no staged block
  // is given back under a worker still writing it.
  struct Stream {
    PoolIndex to = 0;  // the decode pool
    wire::Transport transport = wire::Transport::NONE;
    LeaseId lease = 0;
    size_t next_block = 0;    // the table's blocks before it are staged (or held there already)
    uint64_t bytes = 0;  // copied there (the Import that takes them counts the blocks)
    std::optional<JobId> moving;   // the stream move in flight
    std::optional<JobId> waiting;  // the final prefill parked until that move ends
    bool stopped = false;  // a move failed or could not stage: the final move copies the rest
    bool dropped = false;  // the sequence was released: its staged blocks go when the move ends
  };
  struct Job {
    JobKind kind;
    PoolIndex pool = 0;  // whose worker runs it
    std::string client;  // ROUTER identity of the requester
    uint64_t request_id = 0;
    LeaseId client_lease = 0;
    std::vector<SeqId> sequences;
    int32_t prefix_hit_tokens = 0;
    // Prefill: the job as sent. Decode: all but the block tables, which are read from the pool
    // when the job is sent (they cannot change while the job holds the sequences busy).
    EnvelopeBuilder message;
    int attempts = 0;
    LeaseId worker = 0;  // 0 while queued
    int64_t submitted_micros = 0;
    bool client_gone = false;  // its client's lease expired: finish without reply or commit
    int64_t broker_micros = 0;  // time kvpoold spent on it: planning, then finishing
    std::optional<PoolIndex> then_migrate_to = std::nullopt;  // a prefill decoded elsewhere
    std::optional<Migration> migration = std::nullopt;        // a migrate job
    std::optional<PrefillSlices> slices = std::nullopt;       // a prefill written in slices
    std::optional<SeqId> stream_of = std::nullopt;  // a stream move of this sequence's blocks
    // A final prefill's end while its sequence's stream move runs: the result, and when the
    // worker reported its last write.
    std::optional<absl::Status> parked = std::nullopt;
    int64_t written_micros = 0;
    // A prefill decoded on another node: moved there once written (then_migrate_to its pool).
    std::string then_migrate_node = {};
    // A move to another node (this kvpoold sends): when it fails unless the peer has answered,
    // and its send job once the peer's receiver is ready, until an idle sender takes it.
    int64_t peer_deadline_micros = 0;
    std::optional<EnvelopeBuilder> peer_send = std::nullopt;
  };
  struct Worker {
    std::string identity;
    Role role;
    PoolIndex pool = 0;
    int32_t gpu = -1;
    std::vector<int32_t> peer_gpus;  // GPUs its GPU can read
    uint32_t pid = 0;
    bool nccl = false;  // it can send and receive over NCCL
    // Its job: one it runs, or the send side of a paired move (which may outlive the move's job
    // when the receiver reported first).
    std::optional<JobId> job;
  };

  // The handler of `envelope`'s kind. Runs under RunGuarded: nothing it throws escapes Handle.
  absl::Status Route(const std::string& from, wire::Envelope::Reader envelope, Outbox& out);
  // Request handlers: OK means the handler queued its own reply or job.
  absl::Status HandlePrefill(const std::string& from, uint64_t id,
                             wire::PrefillRequest::Reader r, Outbox& out);
  absl::Status HandleDecode(const std::string& from, uint64_t id, wire::DecodeRequest::Reader r,
                            Outbox& out);
  absl::Status HandleAppend(const std::string& from, uint64_t id, wire::AppendRequest::Reader r,
                            Outbox& out);
  absl::Status HandleCommit(const std::string& from, uint64_t id, SeqId seq, bool commit,
                            Outbox& out);
  absl::Status HandleRelease(const std::string& from, uint64_t id, SeqId seq, Outbox& out);
  absl::Status HandleFork(const std::string& from, uint64_t id, wire::ForkRequest::Reader r,
                          Outbox& out);
  absl::Status HandleMigrate(const std::string& from, uint64_t id, wire::MigrateRequest::Reader r,
                             Outbox& out);
  absl::Status HandleRegister(const std::string& from, uint64_t id,
                              wire::RegisterRequest::Reader r, Outbox& out);
  absl::Status HandleHeartbeat(const std::string& from, uint64_t id, wire::Heartbeat::Reader r,
                               Outbox& out);
  absl::Status HandleJobEnd(const std::string& from, JobId job, const absl::Status& result,
                            const wire::JobDone::Reader* done, Outbox& out);
  // A receiver opened a fresh link: the send job goes out with its rendezvous.
  absl::Status HandleTransferReady(const std::string& from, wire::TransferReady::Reader r,
                                   Outbox& out);
  void ReplyStats(const std::string& from, uint64_t id, Outbox& out);
  void ReplyHealth(const std::string& from, uint64_t id, Outbox& out);

  // ---- Pools (broker_migrations.cc) ----
  // The pool `seq` lives in; NOT_FOUND for a sequence that lives nowhere.
  absl::StatusOr<PoolIndex> HomeOf(SeqId seq) const;
  // INVALID_ARGUMENT for a pool kvpoold does not have.
  absl::Status CheckPool(int64_t pool) const;
  // Where a prefill or append of `seq` runs: its home when it has one (FAILED_PRECONDITION when
  // `requested` names another), else `requested`, else (-1) the pool with the most blocks free or
  // evictable among those with a worker of `role` (UNAVAILABLE when none has one).
  absl::StatusOr<PoolIndex> Place(SeqId seq, int32_t requested, Role role) const;
  // Starts moving client `lease`'s idle sequence `seq` to pool `to`, answering `client`'s request
  // `request_id` when it ends (at once when nothing needs copying): a migrate job of `to`.
  // The typed errors of docs/protocol.md; nothing changes when it fails.
  // `after`: the prefill it ends (the reply is a PrefillReply), null for a Migrate request.
  struct AfterPrefill {
    int32_t prefix_hit_tokens = 0;
    int64_t written_micros = 0;  // the prefill's last write reported
  };
  absl::Status StartMigration(SeqId seq, PoolIndex to, const std::string& client,
                              uint64_t request_id, LeaseId lease, const AfterPrefill* after,
                              Outbox& out);
  // The MigrateJob `id` copying `moves` of `seq` from pool `source` by `transport`.
  EnvelopeBuilder MigrateJobMessage(JobId id, SeqId seq, PoolIndex source,
                                    wire::Transport transport,
                                    absl::Span<const BlockMove> moves) const;
  // How bytes go from `from` to `to` on the workers kvpoold has now (options_.transport, or the
  // best one); UNIMPLEMENTED without one.
  absl::StatusOr<wire::Transport> ChooseTransport(PoolIndex from, PoolIndex to) const;
  // UNIMPLEMENTED unless `transport` can move bytes from `from` to `to` with these workers.
  absl::Status CheckTransport(wire::Transport transport, PoolIndex from, PoolIndex to) const;
  uint64_t ChunkBytesOf(PoolIndex pool) const;
  // ---- Sliced prefills and streams (broker_streams.cc) ----
  // The slices of a prefill of `count` tokens, or nullopt when it is written whole (no more
  // tokens than a slice).
  std::optional<PrefillSlices> SlicesFor(int32_t chunk_tokens, uint32_t count) const;
  // The PrefillJob of tokens [begin, end) of the whole one.
  static EnvelopeBuilder PrefillSlice(const EnvelopeBuilder& whole, uint32_t begin, uint32_t end);
  // A sliced prefill's slice ended: true when its next slice is queued; false when it ends now.
  bool ContinueSlices(JobId id, const absl::Status& result, Outbox& out);
  // FAILED_PRECONDITION when client `lease`'s sequence `seq` streams to a pool other than
  // `decode_pool` (nullopt: none).
  absl::Status CheckStreamTarget(SeqId seq, LeaseId lease,
                                 std::optional<PoolIndex> decode_pool) const;
  // The stream of `seq` from `from` to `to` for client `lease`: the one it has, or a new one.
  // Null when none may run (a released sequence's stream still moving, or no transport).
  Stream* StreamFor(SeqId seq, PoolIndex from, PoolIndex to, LeaseId lease);
  // A final prefill `id` ends while its sequence's stream move runs: true when it is parked until
  // that move ends (a move still queued is dropped instead, and false returned).
  bool ParkBehindStream(JobId id, const absl::Status& result);
  // Stages the blocks of `seq` that became full since the last stream move and queues a move of
  // them, unless one is in flight or the stream stopped.
  void StreamBlocks(SeqId seq, Outbox& out);
  // A stream move ended: its blocks stay staged (copied) or are given back (failed).
  void EndStreamMove(const Job& move, const absl::Status& result, uint64_t bytes, Outbox& out);
  // The stream of `seq` ends (its final move planned, a failure, or the sequence gone): staged
  // blocks the move did not take go back. REQUIRES: no stream move in flight.
  void EndStream(SeqId seq);
  // The stream of `seq` must not be used again (a failed write, a release): it ends now, or when
  // its move in flight ends.
  void DropStream(SeqId seq);
  // ---- Across nodes (broker_peers.cc, docs/design.md §11) ----
  // A sequence of this kvpoold's clients that lives on a peer node: its id and pool there (the
  // peer holds it under this kvpoold's lease), and its owner here.
  struct RemoteHome {
    std::string node;
    SeqId remote = 0;
    PoolIndex pool = 0;
    LeaseId lease = 0;
    int64_t length_moved = 0;  // its length when it moved (for the move's reply only)
  };
  // A client's request forwarded to a peer: whom to answer, and the sequence ids to map back.
  struct ForwardedCall {
    std::string node;
    std::string client;
    uint64_t request_id = 0;
    LeaseId lease = 0;
    int64_t deadline_micros = 0;
    absl::flat_hash_map<SeqId, SeqId> local_of;  // the peer's id -> this kvpoold's
    std::optional<SeqId> released;               // a release: the sequence it forgets here
  };
  struct PeerLink {
    std::string endpoint;
    int64_t last_heard_micros = 0;
  };
  static bool IsRemoteMove(const Job& job) {
    return job.migration.has_value() && !job.migration->to_node.empty();
  }
  static bool IsPeerImport(const Job& job) {
    return job.migration.has_value() && !job.migration->from_peer.empty();
  }
  // A message on this kvpoold's link to peer `node`: a reply to what it asked there.
  absl::Status HandlePeerMessage(const std::string& node, wire::Envelope::Reader envelope,
                                 Outbox& out);
  // A peer kvpoold's request to take a sequence (the receiving side).
  absl::Status HandlePeerImport(const std::string& from, uint64_t id,
                                wire::PeerImportRequest::Reader r, Outbox& out);
  // INVALID_ARGUMENT unless `node` is a peer (this kvpoold's own name is no peer).
  absl::Status CheckPeer(absl::string_view node) const;
  // True when `node` names another node (not empty, not this one).
  bool IsOtherNode(absl::string_view node) const {
    return !node.empty() && node != options_.node_name;
  }
  // FAILED_PRECONDITION when `seq` lives on a peer: only decode and release go there.
  absl::Status CheckNotRemote(SeqId seq) const;
  // Starts moving client `lease`'s idle sequence `seq` to pool `to_pool` of peer `node` (the
  // sending side): the peer is asked to import it, its receiver's link is handed to an idle
  // sender of the source pool, and the sequence is released here once the peer committed it.
  absl::Status StartRemoteMigration(SeqId seq, const std::string& node, PoolIndex to_pool,
                                    const std::string& client, uint64_t request_id,
                                    LeaseId lease, const AfterPrefill* after, Outbox& out);
  // The peer answered a move (`reply`, or an error in `result`), or it did not in time.
  void FinishRemoteMove(JobId id, absl::Status result, const wire::PeerImportReply::Reader* reply,
                        Outbox& out);
  // Hands the send jobs of moves to peers to idle senders.
  void StartPeerSends(Outbox& out);
  // Client requests on sequences that live on a peer, sent there.
  absl::Status ForwardDecode(const std::string& from, uint64_t id, wire::DecodeRequest::Reader r,
                             Outbox& out);
  absl::Status ForwardRelease(const std::string& from, uint64_t id, SeqId seq, Outbox& out);
  // Takes forwarded call `call_id` out (it counted as its client's request unless a release).
  ForwardedCall EndForwarded(uint64_t call_id);
  // A forwarded request's answer, relayed to its client with this kvpoold's sequence ids.
  void RelayForwarded(uint64_t call, wire::Envelope::Reader answer, Outbox& out);
  // Heartbeats to every peer (they renew this kvpoold's lease there), and the deadlines of moves
  // and requests a peer did not answer.
  void TickPeers(Outbox& out);
  // A client gone: its sequences on peers are released there.
  void ReleaseRemote(LeaseId lease, Outbox& out);
  void SendToPeer(const std::string& node, EnvelopeBuilder message, Outbox& out);
  // Releases peer `node`'s sequence `remote` there, answer unawaited (nobody here holds it).
  void ReleaseOnPeer(const std::string& node, SeqId remote, Outbox& out);
  void FillPeerStats(wire::StatsReply::Builder stats, LeaseId lease) const;
  // A fresh id for a sequence a peer moves here: one no sequence here has.
  SeqId NewImportedSequenceId();
  // ---- Paired moves (broker_paired_moves.cc) ----
  // An idle worker of the source pool to send `job`'s blocks to `receiver`: one with an open
  // link to it first.
  std::optional<LeaseId> IdleSender(const Job& job, LeaseId receiver) const;
  // Gives the paired move `id` to `receiver` and `sender`: the receive job now, the send job now
  // on an open link or once the receiver has opened a fresh one.
  void StartPairedMove(JobId id, LeaseId receiver, LeaseId sender, Outbox& out);
  // The move's job for one side of its link.
  EnvelopeBuilder LinkJobFor(const Job& job, wire::TransferSide side,
                             kj::ArrayPtr<const kj::byte> rendezvous) const;
  // A sender's report: it is free again; a failure closes its link.
  void EndSend(LeaseId sender, JobId id, const absl::Status& result, Outbox& out);
  // A paired move's receiver reported: a link that carried it stays open for the pair (NCCL), one
  // that failed is closed.
  void NoteLinkEnd(const Migration& m, LeaseId receiver, const absl::Status& result);
  // Links of `lease` (a worker gone, or a move that failed on it) are not reused.
  void CloseLinks(LeaseId lease);
  // A migration's end: commit on the destination and release the source, or abort the import.
  // The status of the move (OK, or why it failed).
  absl::Status EndMigration(SeqId seq, const Migration& m, absl::Status result, uint64_t bytes);
  void FillMigrationReport(const Migration& m, const absl::Status& status, uint64_t bytes,
                           wire::MigrationReport::Builder report) const;
  // Replies to a prefill (`migration`: with how its move to the decode pool went).
  void ReplyPrefill(const std::string& to, uint64_t request_id, SeqId seq, int32_t hits,
                    const Migration* migration, const absl::Status& moved, uint64_t bytes,
                    Outbox& out);
  void ReplyMigrate(const std::string& to, uint64_t request_id, SeqId seq, const Migration& m,
                    uint64_t bytes, Outbox& out);
  void FillPoolStates(capnp::List<wire::PoolState>::Builder out) const;
  // The prefill and decode workers registered for `pool`.
  std::pair<uint32_t, uint32_t> WorkersOf(PoolIndex pool) const;

  // Plans appending `tokens` (with their content digests, empty: synthetic) to `seq` in `pool` for
  // client `from` (prefill and engine append): refused while a job writes the sequence or when
  // the client would pass its block limit; counts prefix hits.
  absl::StatusOr<AppendPlan> PlanAppend(const std::string& from, SeqId seq, PoolIndex pool,
                                        const std::vector<int32_t>& tokens,
                                        absl::Span<const TokenDigest> digests,
                                        const SharingScope& scope);
  // RESOURCE_EXHAUSTED when `lease` holds more blocks than a client may (planned ones included).
  absl::Status CheckBlockLimit(LeaseId lease) const;
  // RESOURCE_EXHAUSTED when `lease` has as many requests in flight as a client may.
  absl::Status CheckRequestLimit(LeaseId lease) const;
  // INVALID_ARGUMENT for NaN or Inf in a client's tensors, unless allowed.
  absl::Status CheckValues(wire::Activations::Reader activations);
  absl::Status CheckValues(wire::Queries::Reader queries);
  // The caller's lease, granted on first use and renewed by every request.
  LeaseId ClientLease(const std::string& identity);
  // OK when `seq` exists, belongs to `lease` and has no job in flight.
  absl::Status CheckOwnedIdle(SeqId seq, LeaseId lease) const;
  bool HasWorker(Role role, PoolIndex pool) const;
  // A worker that can take `job` (of its pool, and of its role unless it is a migration).
  bool CanRun(const Worker& worker, const Job& job) const;
  bool CanRunSomewhere(const Job& job) const;

  void Enqueue(Job job, Outbox& out);
  void Dispatch(Outbox& out);
  // Starts every queued paired move for which an idle receiver and an idle sender exist.
  void StartPairedMoves(Outbox& out);
  // The decode job for `worker`: the template plus each step's block table as a delta against
  // what that worker holds.
  EnvelopeBuilder DecodeJobFor(const Job& job, LeaseId worker);
  // Workers no longer hold `seq`'s table as sent (released, or its owner is gone).
  void ForgetTables(SeqId seq);
  // Ends a job: commit + reply on success, abort + error reply otherwise.
  void FinishJob(JobId id, const absl::Status& result, const wire::JobDone::Reader* done,
                 Outbox& out);
  void EndWorker(LeaseId lease, const std::string& why, Outbox& out);
  void EndClient(LeaseId lease, Outbox& out);
  void ReleaseLeaseHoldings(LeaseId lease);
  // A running job of expired client `lease` ended: the lease's holdings go after its last one.
  void EndDeferredJob(LeaseId lease);

  void Reply(Outbox& out, const std::string& to, EnvelopeBuilder message);
  void ReplyError(Outbox& out, const std::string& to, uint64_t id, const absl::Status& status);

  PoolSet* pools_;
  const Clock* clock_;
  BrokerOptions options_;
  bool draining_ = false;
  JobId next_job_ = 1;
  absl::flat_hash_map<JobId, Job> jobs_;
  std::deque<JobId> queues_[kJobKinds];  // by kind
  absl::flat_hash_map<LeaseId, Worker> workers_;
  absl::flat_hash_map<std::string, LeaseId> worker_leases_;  // identity -> lease
  absl::flat_hash_map<std::string, LeaseId> client_leases_;  // identity -> lease
  absl::flat_hash_map<LeaseId, std::string> client_identities_;
  absl::flat_hash_map<SeqId, JobId> busy_;      // sequences a job is writing
  absl::flat_hash_map<LeaseId, int> deferred_;  // expired clients: running jobs left
  absl::flat_hash_map<SeqId, Stream> streams_;  // sequences streaming to their decode pool
  // Open NCCL links by (sender, receiver) worker: their communicators are reused.
  absl::flat_hash_map<std::pair<LeaseId, LeaseId>, uint64_t> links_;
  uint64_t next_link_ = 1;
  // Per decode worker, the block table it holds for each sequence (what was last sent), and the
  // sequences it may forget; decode jobs carry only what changed (protocol/block_tables.h).
  absl::flat_hash_map<LeaseId, absl::flat_hash_map<SeqId, HeldBlockTable>> sent_tables_;
  absl::flat_hash_map<LeaseId, std::vector<SeqId>> forget_;
  // What each client lease has in flight and has gained from prefix hits (its own Stats).
  struct ClientUsage {
    int requests = 0;
    uint64_t prefix_hit_blocks = 0;
  };
  absl::flat_hash_map<LeaseId, ClientUsage> usage_;
  ContentDigester digester_;
  BrokerMetrics metrics_;
  Recovered recovered_;
  std::function<void(const char*)> receive_hook_;
  absl::flat_hash_map<std::string, PeerLink> peers_;   // by node name
  absl::flat_hash_map<SeqId, RemoteHome> remote_;     // sequences that live on peers
  absl::flat_hash_map<uint64_t, ForwardedCall> forwarded_;  // by the request id sent
  // Moves to peers whose send half waits for an idle sender, oldest first (ended ones are
  // skipped and dropped when met).
  std::deque<JobId> peer_sends_waiting_;
  int64_t next_peer_heartbeat_ = 0;
  SeqId next_imported_ = 0;
  LeaseId quarantine_ = 0;
  std::vector<uint32_t> quarantine_pids_;
  void CheckQuarantine();  // ends it when its workers are done
  void EndQuarantine(const char* why);
};

}  // namespace kvp
