// The Broker's pools (daemon/broker.h): where a sequence lives and is placed, and how it moves to
// another pool: planned as an Import on the destination, copied by a worker there, committed there
// and only then released on the source (docs/design.md §6).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/broker.h"  // the class whose members these are
#include "daemon/served_arena.h"
#include "protocol/status_codec.h"
#include "protocol/transport_names.h"

namespace kvp {

absl::StatusOr<PoolIndex> Broker::HomeOf(SeqId seq) const {
  RETURN_IF_ERROR(CheckNotRemote(seq));
  const std::optional<PoolIndex> home = pools_->Home(seq);
  if (!home.has_value()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return *home;
}

absl::Status Broker::CheckPool(int64_t pool) const {
  if (pool < 0 || pool >= static_cast<int64_t>(pools_->size())) {
    return absl::InvalidArgumentError(absl::StrCat("pool ", pool, " does not exist: kvpoold has ",
                                                   pools_->size(), " (0 to ",
                                                   pools_->size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolIndex> Broker::Place(SeqId seq, int32_t requested, Role role) const {
  RETURN_IF_ERROR(CheckNotRemote(seq));
  if (const std::optional<PoolIndex> home = pools_->Home(seq); home.has_value()) {
    if (requested >= 0 && static_cast<PoolIndex>(requested) != *home) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq, " lives in pool ", *home, ", not pool ", requested,
                       "; it continues there (migrate it to move it)"));
    }
    if (!HasWorker(role, *home)) {
      return absl::UnavailableError(absl::StrCat("no ", RoleName(role), " worker serves pool ",
                                                 *home, ", where sequence ", seq, " lives"));
    }
    return *home;
  }
  if (requested >= 0) {
    RETURN_IF_ERROR(CheckPool(requested));
    if (!HasWorker(role, static_cast<PoolIndex>(requested))) {
      return absl::UnavailableError(
          absl::StrCat("no ", RoleName(role), " worker serves pool ", requested));
    }
    return static_cast<PoolIndex>(requested);
  }
  // The pool with the most room (free, or cached and evictable) that can run the job.
  std::optional<PoolIndex> best;
  int64_t best_room = -1;
  for (PoolIndex i = 0; i < pools_->size(); ++i) {
    if (!HasWorker(role, i)) continue;
    const PoolCounts c = pools_->pool(i).blocks().counts();
    if (c.free + c.cached > best_room) {
      best = i;
      best_room = c.free + c.cached;
    }
  }
  if (!best.has_value()) {
    return absl::UnavailableError(absl::StrCat("no ", RoleName(role), " worker is registered"));
  }
  return *best;
}

uint64_t Broker::ChunkBytesOf(PoolIndex pool) const {
  return pool < options_.pool_chunk_bytes.size() ? options_.pool_chunk_bytes[pool]
                                                 : kHostChunkBytes;
}

absl::Status Broker::CheckTransport(wire::Transport transport, PoolIndex from,
                                    PoolIndex to) const {
  const int32_t source_gpu = options_.pool_gpus[from];
  const int32_t target_gpu = options_.pool_gpus[to];
  const bool host = source_gpu < 0 && target_gpu < 0, cuda = source_gpu >= 0 && target_gpu >= 0;
  const auto where = [](PoolIndex pool, int32_t gpu) {
    return absl::StrCat("pool ", pool, gpu < 0 ? " (host)" : absl::StrCat(" (GPU ", gpu, ")"));
  };
  const auto refuse = [&](absl::string_view why) {
    return absl::UnimplementedError(absl::StrCat("moving ", where(from, source_gpu), " to ",
                                                 where(to, target_gpu), " by ",
                                                 TransportName(transport), ": ", why));
  };
  const auto nccl_worker = [&](PoolIndex pool) {
    return std::any_of(workers_.begin(), workers_.end(),
                       [&](const auto& w) { return w.second.pool == pool && w.second.nccl; });
  };
  switch (transport) {
    case wire::Transport::HOST:
    case wire::Transport::SOCKET:
      if (!host) return refuse("it moves host pools only");
      return absl::OkStatus();
    case wire::Transport::PEER_COPY: {
      if (!cuda) return refuse("it moves cuda pools only");
      if (source_gpu == target_gpu) return absl::OkStatus();
      const bool peer = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
        const std::vector<int32_t>& peers = w.second.peer_gpus;
        return w.second.pool == to &&
               std::find(peers.begin(), peers.end(), source_gpu) != peers.end();
      });
      if (!peer) return refuse("no worker of the destination has peer access to the source");
      return absl::OkStatus();
    }
    case wire::Transport::NCCL:
      if (!cuda) return refuse("it moves cuda pools only");
      if (source_gpu == target_gpu) return refuse("NCCL refuses two ranks on one GPU");
      if (!nccl_worker(from) || !nccl_worker(to)) {
        return refuse("a worker of each pool must have NCCL (libnccl.so.2 loadable)");
      }
      return absl::OkStatus();
    case wire::Transport::NONE:
      break;
  }
  return refuse("not a transport");
}

absl::StatusOr<wire::Transport> Broker::ChooseTransport(PoolIndex from, PoolIndex to) const {
  if (options_.transport.has_value()) {
    RETURN_IF_ERROR(CheckTransport(*options_.transport, from, to));
    return *options_.transport;
  }
  if (options_.pool_gpus[from] < 0) return wire::Transport::HOST;
  if (CheckTransport(wire::Transport::PEER_COPY, from, to).ok()) return wire::Transport::PEER_COPY;
  RETURN_IF_ERROR(CheckTransport(wire::Transport::NCCL, from, to));
  return wire::Transport::NCCL;
}

absl::Status Broker::HandleMigrate(const std::string& from, uint64_t id,
                                   wire::MigrateRequest::Reader r, Outbox& out) {
  if (draining_) return absl::UnavailableError("kvpoold is draining; retry on another instance");
  const LeaseId lease = ClientLease(from);
  RETURN_IF_ERROR(CheckRequestLimit(lease));
  if (IsOtherNode(r.getToNode().cStr())) {
    return StartRemoteMigration(r.getSequence(), r.getToNode().cStr(), r.getToPool(), from, id,
                                lease, /*after=*/nullptr, out);
  }
  return StartMigration(r.getSequence(), r.getToPool(), from, id, lease, /*after=*/nullptr, out);
}

absl::Status Broker::StartMigration(SeqId seq, PoolIndex to, const std::string& client,
                                    uint64_t request_id, LeaseId lease,
                                    const AfterPrefill* after, Outbox& out) {
  RETURN_IF_ERROR(CheckPool(to));
  RETURN_IF_ERROR(CheckOwnedIdle(seq, lease));
  ASSIGN_OR_RETURN(const PoolIndex source, HomeOf(seq));
  Migration m{.from = source, .to = to, .started_micros = clock_->NowMicros(),
              .after_prefill = after != nullptr};
  if (after != nullptr) m.prefill_end_micros = after->written_micros;
  // What streamed while it was written (a streamed prefill) is taken by the Import below.
  if (auto stream = streams_.find(seq); stream != streams_.end()) {
    if (stream->second.moving.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "blocks of sequence ", seq, " are moving to pool ", stream->second.to,
          " (a continued prefill); move it with its last prefill, or once the move ends"));
    }
    if (stream->second.dropped || stream->second.to != to || source == to) {
      EndStream(seq);  // staged blocks of an earlier life, or for another pool: none is taken
    } else {
      m.transport = stream->second.transport;
      m.bytes_streamed = stream->second.bytes;
    }
  }
  const int32_t prefix_hit_tokens = after != nullptr ? after->prefix_hit_tokens : 0;
  Job job{.kind = JobKind::kMigrate,
          .pool = to,
          .client = client,
          .request_id = request_id,
          .client_lease = lease,
          .sequences = {seq},
          .prefix_hit_tokens = prefix_hit_tokens,
          .message = EnvelopeBuilder(next_job_),
          .submitted_micros = m.started_micros};
  if (source != to) {
    if (m.transport == wire::Transport::NONE) {
      ASSIGN_OR_RETURN(m.transport, ChooseTransport(source, to));
    }
    if (!CanRunSomewhere(job)) {
      return absl::UnavailableError(
          absl::StrCat("no worker serves pool ", to, " to receive sequence ", seq));
    }
    const auto serves_source = [&](const auto& w) { return w.second.pool == source; };
    if (IsPaired(m.transport) && std::none_of(workers_.begin(), workers_.end(), serves_source)) {
      return absl::UnavailableError(absl::StrCat("no worker serves pool ", source, " to send "
                                                 "sequence ", seq, " by ",
                                                 TransportName(m.transport)));
    }
    ASSIGN_OR_RETURN(SequenceImage image, pools_->pool(source).sequences().Image(seq));
    const size_t blocks = image.blocks.size();
    SequenceTable& target = pools_->pool(to).sequences();
    size_t taken = 0;  // staged blocks: copied by the prefill's stream
    absl::StatusOr<std::vector<BlockMove>> imported =
        target.Import(seq, lease, std::move(image), &taken);
    EndStream(seq);  // staged blocks the Import did not take go back
    if (!imported.ok()) return imported.status();
    const std::vector<BlockMove>& moves = *imported;
    // A staged block the destination has come to hold meanwhile (a hit) was given back.
    m.blocks_streamed = static_cast<uint32_t>(taken);
    m.blocks_moved = static_cast<uint32_t>(moves.size() + m.blocks_streamed);
    m.blocks_shared = static_cast<uint32_t>(blocks - m.blocks_moved);
    if (!moves.empty()) {
      job.message = MigrateJobMessage(next_job_++, seq, source, m.transport, moves);
      job.migration = m;
      Enqueue(std::move(job), out);
      return absl::OkStatus();
    }
    if (m.blocks_streamed == 0) m.transport = wire::Transport::NONE;  // nothing was copied
  }
  // Nothing to copy: the move commits now.
  const absl::Status moved = source == to ? absl::OkStatus() : EndMigration(seq, m, {}, 0);
  if (after != nullptr) {
    ReplyPrefill(client, request_id, seq, prefix_hit_tokens, &m, moved, 0, out);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(moved);
  ReplyMigrate(client, request_id, seq, m, 0, out);
  return absl::OkStatus();
}

EnvelopeBuilder Broker::MigrateJobMessage(JobId id, SeqId seq, PoolIndex source,
                                          wire::Transport transport,
                                          absl::Span<const BlockMove> moves) const {
  EnvelopeBuilder message(id);
  auto mj = message.envelope().getBody().initMigrateJob();
  mj.setJob(id);
  mj.setSequence(seq);
  mj.setSourcePool(source);
  mj.setSourceChannel(options_.fd_channel_paths[source]);
  mj.setSourceGpu(options_.pool_gpus[source]);
  mj.setTransport(transport);
  auto list = mj.initMoves(static_cast<unsigned>(moves.size()));
  for (size_t i = 0; i < moves.size(); ++i) {
    list[i].setSource(moves[i].source);
    list[i].setTarget(moves[i].target);
  }
  return message;
}

absl::Status Broker::EndMigration(SeqId seq, const Migration& m, absl::Status result,
                                  uint64_t bytes) {
  SequenceTable& target = pools_->pool(m.to).sequences();
  absl::Status status = std::move(result);
  if (status.ok()) status = target.Commit(seq);
  if (status.ok() && !m.from_peer.empty()) {
    // From another node: committed here, and that node releases its copy once told.
    const int64_t micros = clock_->NowMicros() - m.started_micros;
    metrics_.ObserveMigration(TransportName(m.transport), true, bytes, micros * 1e-6);
    spdlog::info("sequence {} moved here from node {} into pool {} by {}: {} blocks, {} bytes, "
                 "{} us", seq, m.from_peer, m.to, TransportName(m.transport), m.blocks_moved,
                 bytes, micros);
    return status;
  }
  if (status.ok()) {
    // Committed on the destination: the source lets its blocks go (indexed ones stay as its
    // prefix cache) and its workers may forget the table.
    status = pools_->pool(m.from).sequences().Release(seq);
    ForgetTables(seq);
    if (!status.ok()) {
      spdlog::error("sequence {}: releasing pool {} after its move to pool {}: {}", seq, m.from,
                    m.to, status.ToString());
    }
  } else {
    target.Abort(seq).IgnoreError();
  }
  const char* transport = TransportName(m.transport);
  const int64_t micros = clock_->NowMicros() - m.started_micros;
  metrics_.ObserveMigration(transport, status.ok(), bytes + m.bytes_streamed, micros * 1e-6);
  if (status.ok()) {
    metrics_.streamed_blocks += m.blocks_streamed;
    spdlog::info("sequence {} moved from pool {} to pool {} by {}: {} blocks copied ({} while it "
                 "was prefilled), {} shared, {} bytes, {} us", seq, m.from, m.to, transport,
                 m.blocks_moved, m.blocks_streamed, m.blocks_shared, bytes + m.bytes_streamed,
                 micros);
    return status;
  }
  if (!m.from_peer.empty()) {
    spdlog::warn("sequence {}: receiving it from {} by {} failed: {}", seq, m.from_peer,
                 transport, status.ToString());
    return absl::AbortedError(absl::StrCat("receiving it into pool ", m.to, " failed (",
                                           status.message(), "); nothing was committed"));
  }
  spdlog::warn("sequence {}: the move from pool {} to pool {} by {} failed: {}", seq, m.from,
               m.to, transport, status.ToString());
  return absl::AbortedError(absl::StrCat("moving sequence ", seq, " from pool ", m.from,
                                         " to pool ", m.to, " failed (", status.message(),
                                         "); nothing was committed there and it still lives in "
                                         "pool ", m.from));
}

void Broker::FillMigrationReport(const Migration& m, const absl::Status& status, uint64_t bytes,
                                 wire::MigrationReport::Builder report) const {
  report.setFromPool(m.from);
  report.setToPool(m.to);
  report.setTransport(m.transport);
  report.setBlocksMoved(m.blocks_moved);
  report.setBlocksShared(m.blocks_shared);
  report.setBytes(bytes + m.bytes_streamed);
  const int64_t now = clock_->NowMicros();
  report.setMicros(static_cast<uint64_t>(std::max<int64_t>(0, now - m.started_micros)));
  report.setStreamedBlocks(m.blocks_streamed);
  report.setToNode(m.to_node);
  if (m.after_prefill) {
    report.setAfterPrefillMicros(
        static_cast<uint64_t>(std::max<int64_t>(0, now - m.prefill_end_micros)));
  }
  if (!status.ok()) StatusToWire(status, report.initError());
}

void Broker::ReplyPrefill(const std::string& to, uint64_t request_id, SeqId seq, int32_t hits,
                          const Migration* migration, const absl::Status& moved, uint64_t bytes,
                          Outbox& out) {
  EnvelopeBuilder reply(request_id);
  auto p = reply.envelope().getBody().initPrefillReply();
  p.setSequence(seq);
  p.setPrefixHitTokens(static_cast<uint32_t>(hits));
  if (const std::optional<PoolIndex> home = pools_->Home(seq); home.has_value()) {
    p.setPool(*home);
    p.setLength(static_cast<uint64_t>(pools_->pool(*home).sequences().Length(seq).value_or(0)));
  } else if (auto remote = remote_.find(seq); remote != remote_.end()) {
    p.setPool(remote->second.pool);
    p.setLength(static_cast<uint64_t>(remote->second.length_moved));
    p.setNode(remote->second.node);
  }
  if (migration != nullptr) FillMigrationReport(*migration, moved, bytes, p.initMigration());
  Reply(out, to, std::move(reply));
}

void Broker::ReplyMigrate(const std::string& to, uint64_t request_id, SeqId seq,
                          const Migration& m, uint64_t bytes, Outbox& out) {
  EnvelopeBuilder reply(request_id);
  auto r = reply.envelope().getBody().initMigrateReply();
  r.setSequence(seq);
  auto remote = remote_.find(seq);
  r.setLength(static_cast<uint64_t>(
      remote != remote_.end() && !m.to_node.empty()
          ? remote->second.length_moved
          : pools_->pool(m.to).sequences().Length(seq).value_or(0)));
  FillMigrationReport(m, absl::OkStatus(), bytes, r.initMigration());
  Reply(out, to, std::move(reply));
}

void Broker::FillPoolStates(capnp::List<wire::PoolState>::Builder out) const {
  for (PoolIndex i = 0; i < pools_->size(); ++i) {
    const Pool& pool = pools_->pool(i);
    const PoolCounts c = pool.blocks().counts();
    auto p = out[i];
    p.setIndex(i);
    p.setGpu(options_.pool_gpus[i]);
    p.setBlocksFree(static_cast<uint64_t>(c.free));
    p.setBlocksReserved(static_cast<uint64_t>(c.reserved));
    p.setBlocksUsed(static_cast<uint64_t>(c.used));
    p.setBlocksCached(static_cast<uint64_t>(c.cached));
    p.setSequences(static_cast<uint32_t>(pool.sequences().size()));
    const auto [prefill, decode] = WorkersOf(i);
    p.setPrefillWorkers(prefill);
    p.setDecodeWorkers(decode);
  }
}

std::pair<uint32_t, uint32_t> Broker::WorkersOf(PoolIndex pool) const {
  uint32_t prefill = 0, decode = 0;
  for (const auto& [lease, w] : workers_) {
    if (w.pool != pool) continue;
    ++(w.role == Role::kPrefill ? prefill : decode);
  }
  return {prefill, decode};
}

std::string Broker::NotReady() const {
  if (draining_) return "draining";
  for (PoolIndex i = 0; i < pools_->size(); ++i) {
    const auto [prefill, decode] = WorkersOf(i);
    if (prefill == 0 || decode == 0) {
      return absl::StrCat("pool ", i, " has ", prefill, " prefill and ", decode,
                          " decode workers; it needs one of each");
    }
  }
  return "";
}

}  // namespace kvp
