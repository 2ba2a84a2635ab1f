// The Broker across nodes (daemon/broker.h, docs/design.md §11). kvpoolds of different nodes
// are each other's clients over CURVE links: node A moves a sequence to node B by asking B to
// import it (B reserves the blocks under A's lease there, which A's heartbeats renew), hands B's
// receiver link to a sender of its own (the bytes go worker to worker, by socket or NCCL), and
// releases the sequence only once B has committed it. From then on A forwards its client's
// decodes and release of it to B, mapping B's sequence id to the client's.
//
// Failure rules: nothing is released on A before B's commit, and B commits only what its receiver
// reported. A's move fails at its deadline when B does not answer (B's receiver fails at the
// link's own, earlier deadline and aborts B's reservation); when A goes, B's lease for it expires
// and takes its reservations and sequences; a commit B reports after A gave up is released there.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/broker.h"  // the class whose members these are
#include "protocol/lists.h"
#include "protocol/spec_codec.h"
#include "protocol/status_codec.h"
#include "protocol/transport_names.h"

namespace kvp {
namespace {

// Ids of sequences peers move here start high, away from the small ids clients tend to choose.
constexpr SeqId kFirstImportedSequence = SeqId{1} << 62;
// A move to a peer ends this long after the link's own deadline if the peer never answers.
constexpr int64_t kPeerAnswerGraceMicros = 5'000'000;
// A peer is reachable while it answered within this many heartbeats.
constexpr int kReachableHeartbeats = 3;
const char* const kMigrateJob = BodyFieldName(wire::Envelope::Body::MIGRATE_JOB);

std::string PeerOf(absl::string_view from) {
  const absl::string_view rest = from.substr(kPeerPrefix.size());
  return std::string(rest.substr(0, rest.find('/')));
}

}  // namespace

absl::Status Broker::CheckPeer(absl::string_view node) const {
  if (!peers_.contains(node)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node '", node, "' is not a peer of this kvpoold (node '", options_.node_name, "'; ",
        peers_.empty() ? "it has no --peers_file" : "see its --peers_file", ")"));
  }
  return absl::OkStatus();
}

absl::Status Broker::CheckNotRemote(SeqId seq) const {
  if (auto it = remote_.find(seq); it != remote_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", seq, " lives on node ", it->second.node, " (pool ", it->second.pool,
        "); this kvpoold forwards its decodes and its release there, nothing else"));
  }
  return absl::OkStatus();
}

void Broker::SendToPeer(const std::string& node, EnvelopeBuilder message, Outbox& out) {
  message.envelope().setEpoch(options_.epoch);
  const char* kind = BodyFieldName(message.envelope().getBody().which());
  out.push_back({absl::StrCat(kLinkPrefix, node), message.Frame(), kind});
}

void Broker::ReleaseOnPeer(const std::string& node, SeqId remote, Outbox& out) {
  EnvelopeBuilder release(next_job_++);  // its answer matches no call: it is dropped
  release.envelope().getBody().initRelease().setSequence(remote);
  SendToPeer(node, std::move(release), out);
}

SeqId Broker::NewImportedSequenceId() {
  if (next_imported_ < kFirstImportedSequence) next_imported_ = kFirstImportedSequence;
  while (pools_->Home(next_imported_).has_value()) ++next_imported_;
  return next_imported_++;
}

// ---- The sending side ----

absl::Status Broker::StartRemoteMigration(SeqId seq, const std::string& node, PoolIndex to_pool,
                                          const std::string& client, uint64_t request_id,
                                          LeaseId lease, const AfterPrefill* after,
                                          Outbox& out) {
  RETURN_IF_ERROR(CheckPeer(node));
  RETURN_IF_ERROR(CheckOwnedIdle(seq, lease));
  ASSIGN_OR_RETURN(const PoolIndex source, HomeOf(seq));
  const bool cuda = options_.pool_gpus[source] >= 0;
  const wire::Transport transport = cuda ? wire::Transport::NCCL : wire::Transport::SOCKET;
  const bool can_send = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w.second.pool == source && (!cuda || w.second.nccl);
  });
  if (!can_send) {
    return absl::UnavailableError(absl::StrCat("no worker of pool ", source, " can send sequence ",
                                               seq, " to node ", node, " by ",
                                               TransportName(transport)));
  }
  ASSIGN_OR_RETURN(const SequenceImage image, pools_->pool(source).sequences().Image(seq));
  const JobId id = next_job_++;
  const int64_t now = clock_->NowMicros();
  Migration m{.from = source, .to = to_pool, .transport = transport,
              .blocks_moved = static_cast<uint32_t>(image.blocks.size()), .started_micros = now,
              .after_prefill = after != nullptr};
  if (after != nullptr) m.prefill_end_micros = after->written_micros;
  m.to_node = node;

  EnvelopeBuilder ask(id);
  auto r = ask.envelope().getBody().initPeerImport();
  r.setSequence(seq);
  r.setLength(static_cast<uint64_t>(image.length));
  FillList(r.initTail(image.tail.size()), image.tail);
  FillList(r.initBlocks(image.blocks.size()), image.blocks);
  r.setToPool(to_pool);
  r.setTransport(transport);
  PoolSpecToWire(pools_->layout().spec(), r.initSpec());
  r.setSourceChunkBytes(ChunkBytesOf(source));
  SendToPeer(node, std::move(ask), out);

  // The job holds the sequence busy until the peer answers; no worker of this kvpoold runs it
  // (worker 0), a sender takes its send half.
  Job job{.kind = JobKind::kMigrate,
          .pool = source,
          .client = client,
          .request_id = request_id,
          .client_lease = lease,
          .sequences = {seq},
          .prefix_hit_tokens = after != nullptr ? after->prefix_hit_tokens : 0,
          .message = EnvelopeBuilder(id),
          .submitted_micros = now,
          .migration = std::move(m)};
  job.peer_deadline_micros =
      now + int64_t{options_.transfer_timeout_millis} * 1000 + kPeerAnswerGraceMicros;
  busy_[seq] = id;
  ++usage_[lease].requests;
  jobs_.emplace(id, std::move(job));
  spdlog::info("sequence {}: asking node {} to take it into its pool {} ({} blocks, by {})", seq,
               node, to_pool, image.blocks.size(), TransportName(transport));
  return absl::OkStatus();
}

absl::Status Broker::HandlePeerMessage(const std::string& node, wire::Envelope::Reader envelope,
                                       Outbox& out) {
  auto peer = peers_.find(node);
  if (peer == peers_.end()) return absl::InternalError(absl::StrCat("a link to no peer: ", node));
  peer->second.last_heard_micros = clock_->NowMicros();
  const uint64_t id = envelope.getRequestId();
  const auto body = envelope.getBody();
  using W = wire::Envelope::Body;
  if (body.which() == W::HEARTBEAT_REPLY) return absl::OkStatus();
  if (forwarded_.contains(id)) {
    RelayForwarded(id, envelope, out);
    return absl::OkStatus();
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end() || !IsRemoteMove(it->second) || it->second.migration->to_node != node) {
    // A move this kvpoold gave up on (its deadline passed, or its client went): what the peer
    // committed for it is nobody's, so it goes.
    if (body.which() == W::PEER_IMPORT_REPLY) {
      const SeqId orphan = body.getPeerImportReply().getSequence();
      spdlog::warn("node {} committed sequence {} for a move that ended here; releasing it there",
                   node, orphan);
      ReleaseOnPeer(node, orphan, out);
    }
    return absl::OkStatus();
  }
  Job& job = it->second;
  switch (body.which()) {
    case W::MIGRATE_JOB: {
      // The send half, for a sender of the source pool. The peer's blocks are its own business;
      // ours must be exactly the sequence's.
      const auto half = body.getMigrateJob();
      if (job.peer_send.has_value() || job.migration->send_sent || !half.hasLink() ||
          half.getLink().getSide() != wire::TransferSide::SEND ||
          half.getTransport() != job.migration->transport) {
        FinishRemoteMove(id, absl::InternalError(absl::StrCat(
                                 "node ", node, " sent a send half this move cannot take")),
                         nullptr, out);
        return absl::OkStatus();
      }
      const SeqId seq = job.sequences.front();
      ASSIGN_OR_RETURN(const absl::Span<const BlockId> blocks,
                       pools_->pool(job.pool).sequences().Blocks(seq));
      absl::flat_hash_set<BlockId> ours(blocks.begin(), blocks.end()), seen;
      std::vector<BlockMove> moves;
      for (auto move : half.getMoves()) {
        if (!ours.contains(move.getSource()) || !seen.insert(move.getSource()).second) {
          FinishRemoteMove(id, absl::InternalError(absl::StrCat(
                                   "node ", node, "'s send half names block ", move.getSource(),
                                   ", not one of sequence ", seq, "'s")),
                           nullptr, out);
          return absl::OkStatus();
        }
        moves.push_back({.source = move.getSource(), .target = move.getTarget()});
      }
      EnvelopeBuilder send = MigrateJobMessage(id, seq, job.pool, job.migration->transport, moves);
      auto link = send.envelope().getBody().getMigrateJob().initLink();
      const auto theirs = half.getLink();
      link.setSide(wire::TransferSide::SEND);
      link.setId(theirs.getId());
      link.setFresh(true);
      link.setRendezvous(theirs.getRendezvous());
      link.setToken(theirs.getToken());
      link.setDeadlineMillis(std::min<uint32_t>(
          theirs.getDeadlineMillis(), static_cast<uint32_t>(options_.transfer_timeout_millis)));
      link.setSourceChunkBytes(ChunkBytesOf(job.pool));
      link.setTargetChunkBytes(theirs.getTargetChunkBytes());
      job.peer_send = std::move(send);
      peer_sends_waiting_.push_back(id);
      StartPeerSends(out);
      return absl::OkStatus();
    }
    case W::PEER_IMPORT_REPLY: {
      const auto reply = body.getPeerImportReply();
      FinishRemoteMove(id, absl::OkStatus(), &reply, out);
      return absl::OkStatus();
    }
    case W::ERROR: {
      absl::Status failed = StatusFromWire(body.getError());
      if (failed.ok()) failed = absl::UnknownError("the peer answered with an error of code OK");
      FinishRemoteMove(id, failed, nullptr, out);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("node ", node, " answered a move with ",
                                                     BodyFieldName(body.which())));
  }
}

void Broker::StartPeerSends(Outbox& out) {
  for (auto waiting = peer_sends_waiting_.begin(); waiting != peer_sends_waiting_.end();) {
    const JobId id = *waiting;
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !it->second.peer_send.has_value()) {  // the move ended meanwhile
      waiting = peer_sends_waiting_.erase(waiting);
      continue;
    }
    Job& job = it->second;
    const std::optional<LeaseId> sender = IdleSender(job, /*receiver=*/0);
    if (!sender.has_value()) {  // the next dispatch tries again; the link has a deadline
      ++waiting;
      continue;
    }
    Migration& m = *job.migration;
    m.sender = *sender;
    m.send_sent = true;
    workers_.at(*sender).job = id;
    out.push_back({workers_.at(*sender).identity, std::move(*job.peer_send).Frame(), kMigrateJob});
    job.peer_send.reset();
    waiting = peer_sends_waiting_.erase(waiting);
  }
}

void Broker::FinishRemoteMove(JobId id, absl::Status result,
                              const wire::PeerImportReply::Reader* reply, Outbox& out) {
  auto node = jobs_.extract(id);
  Job& job = node.mapped();
  Migration& m = *job.migration;
  const SeqId seq = job.sequences.front();
  busy_.erase(seq);
  if (auto u = usage_.find(job.client_lease); u != usage_.end()) --u->second.requests;
  const uint64_t bytes = reply != nullptr ? reply->getBytes() : 0;
  if (result.ok()) {
    // Committed there: this node lets its blocks go (indexed ones stay as its prefix cache).
    remote_[seq] = RemoteHome{.node = m.to_node,
                              .remote = reply->getSequence(),
                              .pool = reply->getPool(),
                              .lease = job.client_lease,
                              .length_moved = static_cast<int64_t>(reply->getLength())};
    m.to = reply->getPool();
    if (absl::Status released = pools_->pool(m.from).sequences().Release(seq); !released.ok()) {
      spdlog::error("sequence {}: releasing pool {} after its move to node {}: {}", seq, m.from,
                    m.to_node, released.ToString());
    }
    ForgetTables(seq);
  }
  const char* transport = TransportName(m.transport);
  const int64_t micros = clock_->NowMicros() - m.started_micros;
  metrics_.ObserveMigration(transport, result.ok(), bytes, micros * 1e-6);
  metrics_.ObserveJob("migrate", job.client_gone ? "client_gone" : result.ok() ? "ok" : "error",
                      micros * 1e-6);
  absl::Status moved = result;
  if (result.ok()) {
    spdlog::info("sequence {} moved from pool {} to node {} pool {} (its sequence {} there) by "
                 "{}: {} blocks, {} bytes, {} us", seq, m.from, m.to_node, m.to,
                 reply->getSequence(), transport, m.blocks_moved, bytes, micros);
  } else {
    spdlog::warn("sequence {}: the move from pool {} to node {} failed: {}", seq, m.from,
                 m.to_node, result.ToString());
    // The peer's own code (it refused, or its receiver failed: ABORTED), but a peer that did not
    // answer in time is UNAVAILABLE.
    const absl::StatusCode code =
        absl::IsDeadlineExceeded(result) ? absl::StatusCode::kUnavailable : result.code();
    moved = absl::Status(code, absl::StrCat("moving sequence ", seq, " to node ", m.to_node,
                                            " failed (", result.message(), "); nothing was "
                                            "committed there and it still lives in pool ",
                                            m.from));
  }
  if (job.client_gone) {
    EndDeferredJob(job.client_lease);
    if (result.ok()) ReleaseRemote(job.client_lease, out);
    return;
  }
  if (m.after_prefill) {
    ReplyPrefill(job.client, job.request_id, seq, job.prefix_hit_tokens, &m, moved, bytes, out);
  } else if (moved.ok()) {
    ReplyMigrate(job.client, job.request_id, seq, m, bytes, out);
  } else {
    ReplyError(out, job.client, job.request_id, moved);
  }
}

// ---- The receiving side ----

absl::Status Broker::HandlePeerImport(const std::string& from, uint64_t id,
                                      wire::PeerImportRequest::Reader r, Outbox& out) {
  if (!absl::StartsWith(from, kPeerPrefix)) {
    return absl::PermissionDeniedError(
        "peerImport is for the kvpoolds of other nodes (--peers_file), over the tcp endpoint");
  }
  if (draining_) return absl::UnavailableError("kvpoold is draining; retry on another instance");
  RETURN_IF_ERROR(CheckPool(r.getToPool()));
  const PoolIndex to = r.getToPool();
  const PoolSpec& spec = pools_->layout().spec();
  absl::StatusOr<PoolSpec> theirs = PoolSpecFromWire(r.getSpec());
  if (!theirs.ok() || !(*theirs == spec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", PeerOf(from), "'s pools have another layout than this node's (",
        theirs.ok() ? theirs->DebugString() : std::string(theirs.status().message()), " vs ",
        spec.DebugString(), "): their blocks cannot be copied here"));
  }
  const bool cuda = options_.pool_gpus[to] >= 0;
  const wire::Transport transport = cuda ? wire::Transport::NCCL : wire::Transport::SOCKET;
  if (r.getTransport() != transport) {
    return absl::UnimplementedError(absl::StrCat("pool ", to, " of node ", options_.node_name,
                                                 " receives from other nodes by ",
                                                 TransportName(transport), ", not ",
                                                 TransportName(r.getTransport())));
  }
  const uint64_t length = r.getLength();
  const uint64_t block_size = static_cast<uint64_t>(spec.block_size);
  const uint64_t blocks = (length + block_size - 1) / block_size;
  if (length == 0 || length > uint64_t{kMaxPrefillTokens} * 64 || r.getBlocks().size() != blocks ||
      r.getTail().size() != length % block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a sequence of ", length, " tokens has ", blocks, " blocks and ", length % block_size,
        " tail tokens, not ", r.getBlocks().size(), " and ", r.getTail().size()));
  }
  if (r.getSourceChunkBytes() == 0) {
    return absl::InvalidArgumentError("peerImport without its source's chunk size");
  }
  const LeaseId lease = ClientLease(from);
  RETURN_IF_ERROR(CheckRequestLimit(lease));
  const bool can_receive = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w.second.pool == to && (!cuda || w.second.nccl);
  });
  if (!can_receive) {
    return absl::UnavailableError(absl::StrCat("no worker of pool ", to, " can receive by ",
                                               TransportName(transport)));
  }
  // Its blocks are never shared here: their content digests were the other node's.
  SequenceImage image;
  image.scope = SharingScope{.root = kRootPrefixHash, .shared = false};
  image.length = static_cast<int64_t>(length);
  image.tail = ListToVector<int32_t>(r.getTail());
  image.tail_digests.assign(image.tail.size(), kSyntheticTokenDigest);
  image.blocks = ListToVector<BlockId>(r.getBlocks());
  image.keys.resize(image.blocks.size());
  const SeqId seq = NewImportedSequenceId();
  SequenceTable& target = pools_->pool(to).sequences();
  ASSIGN_OR_RETURN(const std::vector<BlockMove> moves, target.Import(seq, lease, std::move(image)));
  if (absl::Status limit = CheckBlockLimit(lease); !limit.ok()) {
    target.Abort(seq).IgnoreError();
    return limit;
  }
  Migration m{.from = to, .to = to, .transport = transport,
              .blocks_moved = static_cast<uint32_t>(moves.size()),
              .started_micros = clock_->NowMicros()};
  m.from_peer = from;
  m.peer_call = id;
  m.peer_chunk_bytes = r.getSourceChunkBytes();
  const JobId job_id = next_job_++;
  spdlog::info("node {} moves its sequence {} here as sequence {} (pool {}, {} blocks)",
               PeerOf(from), r.getSequence(), seq, to, moves.size());
  Enqueue(Job{.kind = JobKind::kMigrate,
              .pool = to,
              .client = from,
              .request_id = id,
              .client_lease = lease,
              .sequences = {seq},
              .message = MigrateJobMessage(job_id, seq, to, transport, moves),
              .submitted_micros = m.started_micros,
              .migration = std::move(m)},
          out);
  return absl::OkStatus();
}

// ---- Forwarding ----

absl::Status Broker::ForwardDecode(const std::string& from, uint64_t id,
                                   wire::DecodeRequest::Reader r, Outbox& out) {
  const LeaseId lease = ClientLease(from);
  const auto steps = r.getSteps();
  const std::string& node = remote_.at(steps[0].getSequence()).node;
  ForwardedCall call{.node = node,
                     .client = from,
                     .request_id = id,
                     .lease = lease,
                     .deadline_micros = clock_->NowMicros() + options_.client_lease_micros,
                     .local_of = {},
                     .released = std::nullopt};
  for (auto s : steps) {
    auto it = remote_.find(s.getSequence());
    if (it == remote_.end() || it->second.node != node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "one decode request runs on one pool: sequence ", steps[0].getSequence(),
          " lives on node ", node, ", sequence ", s.getSequence(), " does not"));
    }
    if (it->second.lease != lease) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", s.getSequence(), " belongs to another client"));
    }
    if (!call.local_of.emplace(it->second.remote, s.getSequence()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s.getSequence(), " appears twice"));
    }
  }
  RETURN_IF_ERROR(CheckRequestLimit(lease));
  const uint64_t call_id = next_job_++;
  EnvelopeBuilder forward(call_id);
  forward.envelope().getBody().setDecode(r);
  for (auto s : forward.envelope().getBody().getDecode().getSteps()) {
    s.setSequence(remote_.at(s.getSequence()).remote);
  }
  ++usage_[lease].requests;
  forwarded_.emplace(call_id, std::move(call));
  SendToPeer(node, std::move(forward), out);
  return absl::OkStatus();
}

absl::Status Broker::ForwardRelease(const std::string& from, uint64_t id, SeqId seq,
                                    Outbox& out) {
  const LeaseId lease = ClientLease(from);
  const RemoteHome& home = remote_.at(seq);
  if (home.lease != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " belongs to another client"));
  }
  const uint64_t call_id = next_job_++;
  EnvelopeBuilder forward(call_id);
  forward.envelope().getBody().initRelease().setSequence(home.remote);
  forwarded_.emplace(call_id, ForwardedCall{.node = home.node,
                                            .client = from,
                                            .request_id = id,
                                            .lease = lease,
                                            .deadline_micros = clock_->NowMicros() +
                                                               options_.client_lease_micros,
                                            .local_of = {{home.remote, seq}},
                                            .released = seq});
  SendToPeer(home.node, std::move(forward), out);
  return absl::OkStatus();
}

Broker::ForwardedCall Broker::EndForwarded(uint64_t call_id) {
  auto node = forwarded_.extract(call_id);
  ForwardedCall call = std::move(node.mapped());
  if (!call.released.has_value()) {  // a decode: a request of its client's
    if (auto u = usage_.find(call.lease); u != usage_.end()) --u->second.requests;
  }
  return call;
}

void Broker::RelayForwarded(uint64_t call_id, wire::Envelope::Reader answer, Outbox& out) {
  const ForwardedCall call = EndForwarded(call_id);
  const auto body = answer.getBody();
  using W = wire::Envelope::Body;
  // A release the peer did, or one of a sequence it no longer has, ends the sequence here too.
  if (call.released.has_value() &&
      (body.which() == W::RELEASE_REPLY ||
       (body.which() == W::ERROR && body.getError().getCode() == wire::StatusCode::NOT_FOUND))) {
    remote_.erase(*call.released);
  }
  if (!client_identities_.contains(call.lease)) return;  // the client is gone
  EnvelopeBuilder reply(call.request_id);
  switch (body.which()) {
    case W::DECODE_REPLY: {
      reply.envelope().getBody().setDecodeReply(body.getDecodeReply());
      for (auto o : reply.envelope().getBody().getDecodeReply().getOutputs()) {
        auto local = call.local_of.find(o.getSequence());
        o.setSequence(local != call.local_of.end() ? local->second : 0);
      }
      break;
    }
    case W::RELEASE_REPLY:
      reply.envelope().getBody().setReleaseReply(body.getReleaseReply());
      break;
    case W::ERROR: {
      // The peer's message names its own sequence ids; the client knows them by its own.
      const absl::Status theirs = StatusFromWire(body.getError());
      ReplyError(out, call.client, call.request_id,
                 absl::Status(theirs.code(), absl::StrCat("node ", call.node, ": ",
                                                          theirs.message())));
      return;
    }
    default:
      ReplyError(out, call.client, call.request_id,
                 absl::InternalError(absl::StrCat("node ", call.node, " answered with ",
                                                  BodyFieldName(body.which()))));
      return;
  }
  Reply(out, call.client, std::move(reply));
}

// ---- Leases and deadlines ----

void Broker::TickPeers(Outbox& out) {
  const int64_t now = clock_->NowMicros();
  if (now >= next_peer_heartbeat_) {
    for (const auto& [name, link] : peers_) {
      EnvelopeBuilder beat(0);
      beat.envelope().getBody().initHeartbeat();
      SendToPeer(name, std::move(beat), out);
    }
    next_peer_heartbeat_ = now + int64_t{options_.heartbeat_millis} * 1000;
  }
  std::vector<JobId> late;
  for (const auto& [id, job] : jobs_) {
    if (IsRemoteMove(job) && now >= job.peer_deadline_micros) late.push_back(id);
  }
  for (JobId id : late) {
    const std::string node = jobs_.at(id).migration->to_node;
    FinishRemoteMove(id, absl::UnavailableError(absl::StrCat("node ", node, " did not answer")),
                     nullptr, out);
  }
  std::vector<uint64_t> unanswered;
  for (const auto& [id, call] : forwarded_) {
    if (now >= call.deadline_micros) unanswered.push_back(id);
  }
  for (uint64_t id : unanswered) {
    const ForwardedCall call = EndForwarded(id);
    if (client_identities_.contains(call.lease)) {
      ReplyError(out, call.client, call.request_id,
                 absl::UnavailableError(absl::StrCat("node ", call.node, " did not answer")));
    }
  }
}

void Broker::ReleaseRemote(LeaseId lease, Outbox& out) {
  for (auto it = remote_.begin(); it != remote_.end();) {
    if (it->second.lease != lease) {
      ++it;
      continue;
    }
    ReleaseOnPeer(it->second.node, it->second.remote, out);
    remote_.erase(it++);
  }
}

void Broker::FillPeerStats(wire::StatsReply::Builder stats, LeaseId lease) const {
  const int64_t now = clock_->NowMicros();
  absl::flat_hash_map<std::string, uint32_t> held;
  size_t mine = 0;
  for (const auto& [seq, home] : remote_) {
    ++held[home.node];
    if (home.lease == lease) ++mine;
  }
  std::vector<std::string> names;
  for (const auto& [name, link] : peers_) names.push_back(name);
  std::sort(names.begin(), names.end());
  auto list = stats.initPeers(static_cast<unsigned>(names.size()));
  for (size_t i = 0; i < names.size(); ++i) {
    const PeerLink& link = peers_.at(names[i]);
    auto p = list[i];
    p.setName(names[i]);
    p.setEndpoint(link.endpoint);
    const int64_t since = link.last_heard_micros > 0 ? now - link.last_heard_micros : 0;
    p.setReachable(link.last_heard_micros > 0 &&
                   since <= int64_t{kReachableHeartbeats} * options_.heartbeat_millis * 1000);
    p.setLastHeardMillis(static_cast<uint64_t>(std::max<int64_t>(0, since / 1000)));
    p.setSequences(held.contains(names[i]) ? held.at(names[i]) : 0);
  }
  const size_t shown = std::min<size_t>(mine, kMaxDecodeSteps);
  auto remote = stats.initRemoteSequences(static_cast<unsigned>(shown));
  size_t i = 0;
  for (const auto& [seq, home] : remote_) {
    if (home.lease != lease || i == shown) continue;
    remote[i].setSequence(seq);
    remote[i].setNode(home.node);
    remote[i].setPool(home.pool);
    ++i;
  }
}

}  // namespace kvp
