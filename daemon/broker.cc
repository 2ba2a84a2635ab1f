#include "daemon/broker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/log_context.h"
#include "base/status_macros.h"
#include "protocol/activations_codec.h"
#include "protocol/capabilities_codec.h"
#include "protocol/finite_check.h"
#include "protocol/guard.h"
#include "protocol/lists.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

const char* BodyName(wire::Envelope::Body::Which which) {
  using W = wire::Envelope::Body;
  switch (which) {
    case W::PREFILL: return "prefill";
    case W::DECODE: return "decode";
    case W::RELEASE: return "release";
    case W::FORK: return "fork";
    case W::STATS: return "stats";
    case W::HEALTH: return "health";
    case W::REGISTER: return "register";
    case W::HEARTBEAT: return "heartbeat";
    case W::JOB_DONE: return "job_done";
    case W::JOB_FAILED: return "job_failed";
    case W::APPEND: return "append";
    case W::COMMIT: return "commit";
    case W::ABORT: return "abort";
    case W::MIGRATE: return "migrate";
    case W::TRANSFER_READY: return "transfer_ready";
    case W::PEER_IMPORT: return "peer_import";
    default: return "other";
  }
}

void SetCopies(const std::vector<std::pair<BlockId, BlockId>>& copies,
               capnp::List<wire::BlockCopy>::Builder out) {
  for (size_t i = 0; i < copies.size(); ++i) {
    out[i].setSource(copies[i].first);
    out[i].setTarget(copies[i].second);
  }
}

absl::Status CheckTokenCount(size_t n, const char* what) {
  if (n == 0 || n > kMaxPrefillTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " needs 1 to ", kMaxPrefillTokens, " tokens, got ", n));
  }
  return absl::OkStatus();
}

// A worker registers only for a pool whose jobs of its role it can run on this kvpoold's arena.
absl::Status CheckCapabilities(wire::Capabilities::Reader caps, const PoolSpec& spec,
                               bool cuda_arena) {
  if (cuda_arena && !caps.hasCudaArena()) {
    return absl::UnimplementedError(
        "the worker cannot serve a cuda arena (a build without CUDA, or --backend=host)");
  }
  if (!cuda_arena && !caps.hasHostArena()) {
    return absl::UnimplementedError("the worker cannot serve a host arena (--backend=cuda)");
  }
  return CheckServes(ServedFromWire(cuda_arena ? caps.getCudaArena() : caps.getHostArena()), spec);
}

}  // namespace

Broker::Broker(PoolSet* pools, const Clock* clock, BrokerOptions options)
    : pools_(pools),
      clock_(clock),
      options_(std::move(options)),
      digester_(options_.digest_key.has_value() ? ContentDigester(*options_.digest_key)
                                                : ContentDigester()) {
  options_.pool_gpus.resize(pools_->size(), -1);
  options_.fd_channel_paths.resize(pools_->size());
  // Client leases recovered from the state log keep their clients' names.
  for (const LeaseTable::ClientLease& lease : pools_->leases().ClientLeases()) {
    client_leases_[lease.client] = lease.id;
    client_identities_[lease.id] = lease.client;
  }
  for (const PeerNode& peer : options_.peers) {
    peers_.emplace(peer.name, PeerLink{.endpoint = peer.endpoint});
  }
}

// ---- Messages in ----

const char* Broker::Handle(const std::string& from, std::vector<zmq::message_t> frames,
                           Outbox& out) {
  uint64_t readable_id = 0;
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> parsed =
      ParseEnvelope(std::move(frames), options_.limits, &readable_id);
  // What comes back on a link to a peer answers this kvpoold: it is never answered in turn.
  const bool link = absl::StartsWith(from, kLinkPrefix);
  if (!parsed.ok()) {
    ++metrics_.requests["malformed"];
    if (link) {
      spdlog::warn("a malformed message from {}: {}", from, parsed.status().ToString());
    } else {
      ReplyError(out, from, readable_id, parsed.status());
    }
    return "malformed";
  }
  const wire::Envelope::Reader envelope = (*parsed)->envelope();
  // Logs of this request carry its id and client (journal fields under systemd).
  const ScopedLogContext log_context(envelope.getRequestId(), from);
  const char* kind = BodyName(envelope.getBody().which());
  const char* body = BodyFieldName(envelope.getBody().which());
  if (receive_hook_) receive_hook_(body);
  ++metrics_.requests[kind];
  if (link) {
    const std::string node(absl::string_view(from).substr(kLinkPrefix.size()));
    const absl::Status handled =
        RunGuarded([&] { return HandlePeerMessage(node, envelope, out); });
    if (!handled.ok()) spdlog::warn("{} from node {}: {}", body, node, handled.ToString());
    return body;
  }
  absl::Status status = RunGuarded([&] { return Route(from, envelope, out); });
  if (absl::IsInternal(status)) {
    spdlog::error("{} from {} failed: {}", kind, from, status.ToString());
  }
  if (status.ok()) return body;
  // A client that names the epoch it last heard from learns why its sequence is unknown.
  const uint64_t seen = envelope.getEpoch();
  if (absl::IsNotFound(status) && seen != 0 && seen != options_.epoch) {
    status = absl::NotFoundError(absl::StrCat(
        status.message(), ": the kvpoold this client last heard from (epoch ", seen,
        ") has restarted, and this one (epoch ", options_.epoch, ") ",
        pools_->tracking_changes()
            ? "kept only what its state log holds: the sequence was released, never committed, "
              "or the restart started empty (its log says why); prefill again"
            : "did not keep its sequences (no --state_dir); prefill again"));
  }
  ReplyError(out, from, envelope.getRequestId(), status);
  return body;
}

absl::Status Broker::Route(const std::string& from, wire::Envelope::Reader envelope,
                           Outbox& out) {
  const uint64_t id = envelope.getRequestId();
  const auto body = envelope.getBody();
  using W = wire::Envelope::Body;
  switch (body.which()) {
    case W::PREFILL:
      return HandlePrefill(from, id, body.getPrefill(), out);
    case W::DECODE:
      return HandleDecode(from, id, body.getDecode(), out);
    case W::APPEND:
      return HandleAppend(from, id, body.getAppend(), out);
    case W::COMMIT:
      return HandleCommit(from, id, body.getCommit().getSequence(), true, out);
    case W::ABORT:
      return HandleCommit(from, id, body.getAbort().getSequence(), false, out);
    case W::RELEASE:
      return HandleRelease(from, id, body.getRelease().getSequence(), out);
    case W::FORK:
      return HandleFork(from, id, body.getFork(), out);
    case W::MIGRATE:
      return HandleMigrate(from, id, body.getMigrate(), out);
    case W::STATS:
      ReplyStats(from, id, out);
      return absl::OkStatus();
    case W::HEALTH:
      ReplyHealth(from, id, out);
      return absl::OkStatus();
    case W::REGISTER:
      return HandleRegister(from, id, body.getRegister(), out);
    case W::HEARTBEAT:
      return HandleHeartbeat(from, id, body.getHeartbeat(), out);
    case W::JOB_DONE: {
      const auto done = body.getJobDone();
      return HandleJobEnd(from, done.getJob(), absl::OkStatus(), &done, out);
    }
    case W::TRANSFER_READY:
      return HandleTransferReady(from, body.getTransferReady(), out);
    case W::PEER_IMPORT:
      return HandlePeerImport(from, id, body.getPeerImport(), out);
    case W::JOB_FAILED: {
      const auto failed = body.getJobFailed();
      absl::Status result = StatusFromWire(failed.getError());
      if (result.ok()) result = absl::UnknownError("the worker reported a failure with code OK");
      return HandleJobEnd(from, failed.getJob(), result, nullptr, out);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("message kind ", static_cast<int>(body.which()), " is not a request"));
  }
}

absl::Status Broker::HandlePrefill(const std::string& from, uint64_t id,
                                   wire::PrefillRequest::Reader r, Outbox& out) {
  if (draining_) return absl::UnavailableError("kvpoold is draining; retry on another instance");
  const SeqId seq = r.getSequence();
  const uint32_t count_in = r.getTokens().size();
  RETURN_IF_ERROR(CheckTokenCount(count_in, "a prefill"));
  std::vector<TokenDigest> digests;  // empty: synthetic, the token ids say it all
  if (r.hasActivations()) {
    RETURN_IF_ERROR(CheckActivations(r.getActivations(), pools_->layout().spec(), count_in));
    RETURN_IF_ERROR(CheckValues(r.getActivations()));
    digests = digester_.TokenDigests(r.getActivations(), 0, count_in);
  }
  ASSIGN_OR_RETURN(const PoolIndex pool, Place(seq, r.getPool(), Role::kPrefill));
  // Decoded on another node: moved there whole once written (docs/design.md §11).
  const std::string decode_node =
      IsOtherNode(r.getDecodeNode().cStr()) ? std::string(r.getDecodeNode().cStr()) : "";
  if (!decode_node.empty()) {
    RETURN_IF_ERROR(CheckPeer(decode_node));
    if (r.getDecodePool() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a decode node (", decode_node, ") needs its decodePool"));
    }
    if (r.getContinued()) {
      return absl::UnimplementedError(
          "continued prefills stream to a pool of this node only; send the last prefill with "
          "the other node's decodePool");
    }
  }
  std::optional<PoolIndex> decode_pool;
  if (decode_node.empty() && r.getDecodePool() >= 0 &&
      static_cast<PoolIndex>(r.getDecodePool()) != pool) {
    RETURN_IF_ERROR(CheckPool(r.getDecodePool()));
    decode_pool = static_cast<PoolIndex>(r.getDecodePool());
    if (!HasWorker(Role::kDecode, *decode_pool)) {
      return absl::UnavailableError(
          absl::StrCat("no decode worker serves pool ", *decode_pool, ", the decode pool asked"));
    }
    RETURN_IF_ERROR(ChooseTransport(pool, *decode_pool).status());
  }
  if (r.getChunkTokens() < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunkTokens ", r.getChunkTokens(), ": -1 (kvpoold's), 0 (whole) or a slice's tokens"));
  }
  // More prefills of it follow (an engine's chunked prefill): its blocks stream to the decode
  // pool as they fill, and the last prefill (not continued) moves it.
  const bool continued = r.getContinued() && decode_pool.has_value();
  RETURN_IF_ERROR(CheckStreamTarget(seq, ClientLease(from), decode_pool));
  RETURN_IF_ERROR(CheckRequestLimit(ClientLease(from)));
  const std::vector<int32_t> tokens = ListToVector<int32_t>(r.getTokens());
  SequenceTable& sequences = pools_->pool(pool).sequences();
  const int64_t length_before = sequences.Length(seq).value_or(0);
  const SharingScope scope{.root = digester_.NamespaceRoot(r.getCacheNamespace().cStr()),
                           .shared = true};
  ASSIGN_OR_RETURN(AppendPlan plan, PlanAppend(from, seq, pool, tokens, digests, scope));
  ASSIGN_OR_RETURN(const LeaseId lease, sequences.Owner(seq));  // the client's, as PlanAppend found it
  const int32_t hits = plan.prefix_hit_tokens;
  if (plan.slots.empty()) {  // every token was a prefix hit
    if (decode_pool.has_value() && !continued) {
      if (auto s = streams_.find(seq); s != streams_.end() && s->second.moving.has_value() &&
                                        s->second.lease == lease) {
        // The last prefill while its stream move runs: it commits and moves once that ends.
        const JobId parked = next_job_++;
        jobs_.emplace(parked, Job{.kind = JobKind::kPrefill,
                                  .pool = pool,
                                  .client = from,
                                  .request_id = id,
                                  .client_lease = lease,
                                  .sequences = {seq},
                                  .prefix_hit_tokens = hits,
                                  .message = EnvelopeBuilder(parked),
                                  .submitted_micros = clock_->NowMicros(),
                                  .then_migrate_to = decode_pool,
                                  .parked = absl::OkStatus(),
                                  .written_micros = clock_->NowMicros()});
        busy_[seq] = parked;
        ++usage_[lease].requests;
        s->second.waiting = parked;
        return absl::OkStatus();
      }
    }
    RETURN_IF_ERROR(sequences.Commit(seq));
    if (!decode_node.empty()) {
      const AfterPrefill after{.prefix_hit_tokens = hits, .written_micros = clock_->NowMicros()};
      const absl::Status started = StartRemoteMigration(
          seq, decode_node, static_cast<PoolIndex>(r.getDecodePool()), from, id, lease, &after,
          out);
      if (!started.ok()) {
        Migration failed{.from = pool, .to = static_cast<PoolIndex>(r.getDecodePool())};
        failed.to_node = decode_node;
        ReplyPrefill(from, id, seq, hits, &failed, started, 0, out);
      }
      return absl::OkStatus();
    }
    if (continued) {
      StreamFor(seq, pool, *decode_pool, lease);
      StreamBlocks(seq, out);
      ReplyPrefill(from, id, seq, hits, nullptr, absl::OkStatus(), 0, out);
      return absl::OkStatus();
    }
    if (decode_pool.has_value()) {
      // Committed: a move that cannot start is said in the reply, never as the prefill's error.
      const AfterPrefill after{.prefix_hit_tokens = hits, .written_micros = clock_->NowMicros()};
      const absl::Status started = StartMigration(seq, *decode_pool, from, id, lease, &after, out);
      EndStream(seq);
      if (!started.ok()) {
        const Migration failed{.from = pool, .to = *decode_pool};
        ReplyPrefill(from, id, seq, hits, &failed, started, 0, out);
      }
      return absl::OkStatus();
    }
    ReplyPrefill(from, id, seq, hits, nullptr, absl::OkStatus(), 0, out);
    return absl::OkStatus();
  }
  const JobId job_id = next_job_++;
  EnvelopeBuilder message(job_id);
  auto job = message.envelope().getBody().initPrefillJob();
  job.setJob(job_id);
  job.setSequence(seq);
  const uint32_t count = static_cast<uint32_t>(tokens.size() - hits);
  FillList(job.initTokens(count), std::vector<int32_t>(tokens.begin() + hits, tokens.end()));
  job.setFirstPosition(static_cast<uint64_t>(length_before + hits));
  FillList(job.initSlotMapping(plan.slots.size()), plan.slots);
  SetCopies(plan.copies, job.initCopies(plan.copies.size()));
  if (r.hasActivations()) {
    CopyActivationRows(r.getActivations(), hits, count, job.initActivations());
  }
  std::optional<PrefillSlices> slices;
  if (decode_pool.has_value()) {
    slices = SlicesFor(r.getChunkTokens(), count);
    if (slices.has_value()) {
      slices->whole = std::move(message);
      message = PrefillSlice(slices->whole, 0, slices->size);
    }
    if (continued || slices.has_value()) StreamFor(seq, pool, *decode_pool, lease);
  }
  if (!decode_node.empty()) decode_pool = static_cast<PoolIndex>(r.getDecodePool());
  Enqueue(Job{.kind = JobKind::kPrefill,
              .pool = pool,
              .client = from,
              .request_id = id,
              .client_lease = lease,
              .sequences = {seq},
              .prefix_hit_tokens = hits,
              .message = std::move(message),
              .submitted_micros = clock_->NowMicros(),
              .then_migrate_to = continued ? std::nullopt : decode_pool,
              .slices = std::move(slices),
              .then_migrate_node = decode_node},
          out);
  return absl::OkStatus();
}

absl::Status Broker::HandleDecode(const std::string& from, uint64_t id,
                                  wire::DecodeRequest::Reader r, Outbox& out) {
  if (draining_) return absl::UnavailableError("kvpoold is draining; retry on another instance");
  const auto steps = r.getSteps();
  if (steps.size() == 0 || steps.size() > kMaxDecodeSteps) {
    return absl::InvalidArgumentError(
        absl::StrCat("a decode needs 1 to ", kMaxDecodeSteps, " steps, got ", steps.size()));
  }
  if (remote_.contains(steps[0].getSequence())) return ForwardDecode(from, id, r, out);
  const int64_t started = clock_->NowMicros();
  const PoolSpec& spec = pools_->layout().spec();
  // A decode job runs on one pool's worker: every sequence of a request must live there.
  ASSIGN_OR_RETURN(const PoolIndex pool, HomeOf(steps[0].getSequence()));
  for (auto s : steps) {
    ASSIGN_OR_RETURN(const PoolIndex home, HomeOf(s.getSequence()));
    if (home != pool) {
      return absl::InvalidArgumentError(absl::StrCat(
          "one decode request runs on one pool: sequence ", steps[0].getSequence(),
          " lives in pool ", pool, ", sequence ", s.getSequence(), " in pool ", home,
          "; send a decode per pool, or migrate them together"));
    }
  }
  if (!HasWorker(Role::kDecode, pool)) {
    return absl::UnavailableError(absl::StrCat("no decode worker serves pool ", pool));
  }
  SequenceTable& sequences = pools_->pool(pool).sequences();
  const LeaseId lease = ClientLease(from);
  RETURN_IF_ERROR(CheckRequestLimit(lease));
  // Check every step before changing anything: a request is planned whole or not at all.
  absl::flat_hash_set<SeqId> seen;
  for (auto s : steps) {
    const SeqId seq = s.getSequence();
    if (!seen.insert(seq).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " appears twice"));
    }
    ASSIGN_OR_RETURN(LeaseId owner, sequences.Owner(seq));
    ASSIGN_OR_RETURN(const int64_t length, sequences.Length(seq));
    ASSIGN_OR_RETURN(const bool pending, sequences.HasPending(seq));
    if (owner == lease && (length == 0 || pending)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "decode before prefill: sequence ", seq, " has no committed prompt yet"));
    }
    RETURN_IF_ERROR(CheckOwnedIdle(seq, lease));
    if (s.hasActivations()) {
      RETURN_IF_ERROR(CheckActivations(s.getActivations(), spec, 1));
      RETURN_IF_ERROR(CheckValues(s.getActivations()));
    }
    if (s.hasQueries()) {
      RETURN_IF_ERROR(CheckQueries(s.getQueries(), spec, options_.model));
      RETURN_IF_ERROR(CheckValues(s.getQueries()));
    }
    if (s.hasNeedle() && s.getNeedle().getPosition() >= static_cast<uint64_t>(length)) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", seq, ": needle position ",
                                                s.getNeedle().getPosition(), " is not below ",
                                                length));
    }
  }
  const JobId job_id = next_job_++;
  EnvelopeBuilder message(job_id);
  auto job = message.envelope().getBody().initDecodeJob();
  job.setJob(job_id);
  job.setOutputLayers(r.getOutputLayers());
  auto job_steps = job.initSteps(steps.size());
  std::vector<SeqId> planned;
  for (unsigned i = 0; i < steps.size(); ++i) {
    const auto s = steps[i];
    const SeqId seq = s.getSequence();
    const int64_t position = sequences.Length(seq).value_or(0);  // checked above
    const int32_t token = s.getToken();
    const std::vector<TokenDigest> digest =
        s.hasActivations() ? digester_.TokenDigests(s.getActivations(), 0, 1)
                           : std::vector<TokenDigest>();
    absl::StatusOr<AppendPlan> plan = sequences.Append(seq, lease, {&token, 1}, digest);
    if (!plan.ok()) {
      for (SeqId p : planned) sequences.Abort(p).IgnoreError();
      return plan.status();
    }
    planned.push_back(seq);
    auto js = job_steps[i];
    js.setSequence(seq);
    js.setToken(token);
    js.setPosition(static_cast<uint64_t>(position));
    js.setSlot(plan->slots.at(0));
    SetCopies(plan->copies, js.initCopies(plan->copies.size()));
    if (s.hasActivations()) js.setActivations(s.getActivations());
    if (s.hasQueries()) js.setQueries(s.getQueries());
    if (s.hasNeedle()) js.setNeedle(s.getNeedle());
  }
  if (absl::Status limit = CheckBlockLimit(lease); !limit.ok()) {
    for (SeqId p : planned) sequences.Abort(p).IgnoreError();
    return limit;
  }
  const int64_t now = clock_->NowMicros();
  Enqueue(Job{.kind = JobKind::kDecode,
              .pool = pool,
              .client = from,
              .request_id = id,
              .client_lease = lease,
              .sequences = std::move(planned),
              .message = std::move(message),
              .submitted_micros = now,
              .broker_micros = now - started},
          out);
  return absl::OkStatus();
}

absl::Status Broker::HandleAppend(const std::string& from, uint64_t id,
                                  wire::AppendRequest::Reader r, Outbox& out) {
  if (draining_) return absl::UnavailableError("kvpoold is draining; retry on another instance");
  const SeqId seq = r.getSequence();
  RETURN_IF_ERROR(CheckTokenCount(r.getTokens().size(), "an append"));
  // kvpoold never sees what an engine writes: its blocks are shared only inside a namespace the
  // engines named, never by token ids alone.
  const absl::string_view name = r.getCacheNamespace().cStr();
  const SharingScope scope{.root = digester_.NamespaceRoot(name), .shared = !name.empty()};
  const std::vector<TokenDigest> digests(r.getTokens().size(), kEngineTokenDigest);
  RETURN_IF_ERROR(CheckNotRemote(seq));
  // An engine writes the arena it attached: a new sequence goes to the pool it names (pool 0,
  // whose fd channel is kvpoold's first, when it names none).
  const absl::StatusOr<PoolIndex> home = HomeOf(seq);
  PoolIndex pool = home.ok() ? *home : 0;
  if (r.getPool() >= 0) {
    RETURN_IF_ERROR(CheckPool(r.getPool()));
    if (home.ok() && *home != static_cast<PoolIndex>(r.getPool())) {
      return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " lives in pool ", *home,
                                                        ", not pool ", r.getPool()));
    }
    pool = static_cast<PoolIndex>(r.getPool());
  }
  ASSIGN_OR_RETURN(AppendPlan plan, PlanAppend(from, seq, pool,
                                               ListToVector<int32_t>(r.getTokens()), digests,
                                               scope));
  EnvelopeBuilder reply(id);
  auto a = reply.envelope().getBody().initAppendReply();
  a.setPrefixHitTokens(plan.prefix_hit_tokens);
  FillList(a.initSlots(plan.slots.size()), plan.slots);
  SetCopies(plan.copies, a.initCopies(plan.copies.size()));
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> blocks,
                   pools_->pool(pool).sequences().Blocks(seq));
  FillList(a.initBlockTable(blocks.size()), blocks);
  a.setPool(pool);
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::StatusOr<AppendPlan> Broker::PlanAppend(const std::string& from, SeqId seq, PoolIndex pool,
                                               const std::vector<int32_t>& tokens,
                                               absl::Span<const TokenDigest> digests,
                                               const SharingScope& scope) {
  if (busy_.contains(seq)) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a job in flight"));
  }
  const LeaseId lease = ClientLease(from);
  SequenceTable& sequences = pools_->pool(pool).sequences();
  ASSIGN_OR_RETURN(AppendPlan plan, sequences.Append(seq, lease, tokens, digests, scope));
  if (absl::Status limit = CheckBlockLimit(lease); !limit.ok()) {
    sequences.Abort(seq).IgnoreError();
    return limit;
  }
  const int64_t hit_blocks = plan.prefix_hit_tokens / pools_->layout().spec().block_size;
  metrics_.prefix_query_tokens += tokens.size();
  metrics_.prefix_hit_tokens += plan.prefix_hit_tokens;
  metrics_.prefix_hit_blocks += hit_blocks;
  usage_[lease].prefix_hit_blocks += hit_blocks;
  return plan;
}

absl::Status Broker::CheckBlockLimit(LeaseId lease) const {
  const int64_t held = pools_->HeldBy(lease);
  if (options_.client_max_blocks > 0 && held > options_.client_max_blocks) {
    ++metrics_.limit_refusals["blocks"];
    return absl::ResourceExhaustedError(absl::StrCat(
        "this request would have the client hold ", held, " blocks; a client may hold ",
        options_.client_max_blocks, " (kvpoold --client_max_blocks): release sequences first"));
  }
  return absl::OkStatus();
}

absl::Status Broker::CheckRequestLimit(LeaseId lease) const {
  auto it = usage_.find(lease);
  if (it != usage_.end() && it->second.requests >= options_.client_max_requests) {
    ++metrics_.limit_refusals["requests"];
    return absl::ResourceExhaustedError(absl::StrCat(
        "the client has ", it->second.requests, " prefill and decode requests in flight; a client "
        "may have ", options_.client_max_requests, " (kvpoold --client_max_requests)"));
  }
  return absl::OkStatus();
}

absl::Status Broker::CheckValues(wire::Activations::Reader activations) {
  if (options_.allow_nonfinite) return absl::OkStatus();
  absl::Status s = CheckFinite(activations);
  if (!s.ok()) ++metrics_.rejected_nonfinite;
  return s;
}

absl::Status Broker::CheckValues(wire::Queries::Reader queries) {
  if (options_.allow_nonfinite) return absl::OkStatus();
  absl::Status s = CheckFinite(queries);
  if (!s.ok()) ++metrics_.rejected_nonfinite;
  return s;
}

absl::Status Broker::HandleCommit(const std::string& from, uint64_t id, SeqId seq, bool commit,
                                  Outbox& out) {
  RETURN_IF_ERROR(CheckOwnedIdle(seq, ClientLease(from)));
  ASSIGN_OR_RETURN(const PoolIndex pool, HomeOf(seq));
  SequenceTable& sequences = pools_->pool(pool).sequences();
  RETURN_IF_ERROR(commit ? sequences.Commit(seq) : sequences.Abort(seq));
  EnvelopeBuilder reply(id);
  // Aborting a new sequence's first append removes the sequence: its length is 0 then.
  const uint64_t length = static_cast<uint64_t>(sequences.Length(seq).value_or(0));
  if (commit) {
    reply.envelope().getBody().initCommitReply().setLength(length);
  } else {
    reply.envelope().getBody().initAbortReply().setLength(length);
  }
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::Status Broker::HandleRelease(const std::string& from, uint64_t id, SeqId seq, Outbox& out) {
  if (remote_.contains(seq)) return ForwardRelease(from, id, seq, out);
  RETURN_IF_ERROR(CheckOwnedIdle(seq, ClientLease(from)));
  ASSIGN_OR_RETURN(const PoolIndex pool, HomeOf(seq));
  SequenceTable& sequences = pools_->pool(pool).sequences();
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> held, sequences.Blocks(seq));
  const size_t blocks = held.size();
  RETURN_IF_ERROR(sequences.Release(seq));
  ForgetTables(seq);
  DropStream(seq);
  EnvelopeBuilder reply(id);
  reply.envelope().getBody().initReleaseReply().setReleasedBlocks(static_cast<uint32_t>(blocks));
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::Status Broker::HandleFork(const std::string& from, uint64_t id, wire::ForkRequest::Reader r,
                                Outbox& out) {
  const LeaseId lease = ClientLease(from);
  RETURN_IF_ERROR(CheckOwnedIdle(r.getSource(), lease));
  ASSIGN_OR_RETURN(const PoolIndex pool, HomeOf(r.getSource()));
  RETURN_IF_ERROR(CheckNotRemote(r.getTarget()));
  if (const std::optional<PoolIndex> other = pools_->Home(r.getTarget()); other.has_value()) {
    return absl::AlreadyExistsError(
        absl::StrCat("sequence ", r.getTarget(), " exists (in pool ", *other, ")"));
  }
  SequenceTable& sequences = pools_->pool(pool).sequences();
  RETURN_IF_ERROR(sequences.Fork(r.getSource(), r.getTarget(), lease));
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> shared, sequences.Blocks(r.getTarget()));
  EnvelopeBuilder reply(id);
  reply.envelope().getBody().initForkReply().setSharedBlocks(static_cast<uint32_t>(shared.size()));
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

void Broker::ReplyStats(const std::string& from, uint64_t id, Outbox& out) {
  const LeaseId lease = ClientLease(from);
  const ClientUsage usage = usage_.contains(lease) ? usage_.at(lease) : ClientUsage();
  const PoolCounts c = pools_->counts();
  EnvelopeBuilder reply(id);
  auto s = reply.envelope().getBody().initStatsReply();
  s.setBlocksFree(c.free);
  s.setBlocksReserved(c.reserved);
  s.setBlocksUsed(c.used);
  s.setBlocksCached(c.cached);
  // Hits are the client's own: another namespace's, or another client's, are none of its business.
  s.setPrefixHitBlocks(usage.prefix_hit_blocks);
  s.setLeases(static_cast<uint32_t>(pools_->leases().size()));
  s.setSequences(static_cast<uint32_t>(pools_->num_sequences()));
  s.setClientBlocks(static_cast<uint64_t>(pools_->HeldBy(lease)));
  s.setClientRequestsInFlight(static_cast<uint32_t>(usage.requests));
  s.setRejectedNonFinite(metrics_.rejected_nonfinite);
  FillPoolStates(s.initPools(pools_->size()));
  auto recovery = s.initRecovery();
  recovery.setSequences(recovered_.sequences);
  recovery.setBlocks(recovered_.blocks);
  recovery.setMicros(recovered_.micros);
  recovery.setStateDir(pools_->tracking_changes());
  FillPeerStats(s, lease);
  Reply(out, from, std::move(reply));
}

void Broker::ReplyHealth(const std::string& from, uint64_t id, Outbox& out) {
  EnvelopeBuilder reply(id);
  auto h = reply.envelope().getBody().initHealthReply();
  h.setReady(!draining_);
  h.setEpoch(options_.epoch);
  h.setWorkers(static_cast<uint32_t>(workers_.size()));
  h.setDraining(draining_);
  PoolSpecToWire(pools_->layout().spec(), h.initSpec());
  FillPoolStates(h.initPools(pools_->size()));
  ModelConfigToWire(options_.model, h.initModel());
  auto limits = h.initLimits();
  limits.setMaxBlocks(static_cast<uint64_t>(options_.client_max_blocks));
  limits.setMaxRequestsInFlight(static_cast<uint32_t>(options_.client_max_requests));
  Reply(out, from, std::move(reply));
}

absl::Status Broker::HandleRegister(const std::string& from, uint64_t id,
                                    wire::RegisterRequest::Reader r, Outbox& out) {
  if (IsRemotePeer(from)) {
    return absl::PermissionDeniedError(
        "workers register over kvpoold's local ipc:// endpoint: they attach the arena through "
        "its fd channel");
  }
  const PoolSpec& spec = pools_->layout().spec();
  // The pool it serves: the one named, else the one on its GPU, else the first.
  PoolIndex pool = 0;
  if (r.getPool() >= 0) {
    RETURN_IF_ERROR(CheckPool(r.getPool()));
    pool = static_cast<PoolIndex>(r.getPool());
  } else if (r.getGpu() >= 0 && options_.pool_gpus[0] >= 0) {  // host pools have no GPU
    const auto on_gpu = std::find(options_.pool_gpus.begin(), options_.pool_gpus.end(), r.getGpu());
    if (on_gpu == options_.pool_gpus.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kvpoold has no pool on GPU ", r.getGpu(), " (kvpoold --gpus); start the worker with "
          "the --gpu of one of its pools, or --pool"));
    }
    pool = static_cast<PoolIndex>(on_gpu - options_.pool_gpus.begin());
  }
  RETURN_IF_ERROR(CheckCapabilities(r.getCapabilities(), spec, options_.pool_gpus[pool] >= 0));
  if (auto it = worker_leases_.find(from); it != worker_leases_.end()) {
    EndWorker(it->second, "registered again", out);
  }
  const Role role = r.getRole() == wire::Role::PREFILL ? Role::kPrefill : Role::kDecode;
  const LeaseId lease = pools_->leases().GrantWorker(
      absl::StrCat(RoleName(role), " worker pid ", r.getPid()), r.getPid());
  workers_.emplace(lease, Worker{.identity = from,
                                 .role = role,
                                 .pool = pool,
                                 .gpu = r.getGpu(),
                                 .peer_gpus = ListToVector<int32_t>(r.getPeerGpus()),
                                 .pid = r.getPid(),
                                 .nccl = r.getCapabilities().getNccl(),
                                 .job = std::nullopt});
  worker_leases_[from] = lease;
  spdlog::info("worker registered: role={} pool={} pid={} gpu={} lease={}", RoleName(role), pool,
               r.getPid(), r.getGpu(), lease);
  EnvelopeBuilder reply(id);
  auto rr = reply.envelope().getBody().initRegisterReply();
  rr.setLease(lease);
  PoolSpecToWire(spec, rr.initSpec());
  rr.setNumBlocks(static_cast<uint64_t>(pools_->pool(pool).blocks().num_blocks()));
  rr.setFdChannel(options_.fd_channel_paths[pool]);
  rr.setPool(pool);
  rr.setEpoch(options_.epoch);
  rr.setHeartbeatMillis(static_cast<uint32_t>(options_.heartbeat_millis));
  ModelConfigToWire(options_.model, rr.initModel());
  rr.setLeaseExpiryMillis(static_cast<uint32_t>(options_.worker_lease_micros / 1000));
  Reply(out, from, std::move(reply));
  Dispatch(out);
  return absl::OkStatus();
}

absl::Status Broker::HandleHeartbeat(const std::string& from, uint64_t id,
                                     wire::Heartbeat::Reader r, Outbox& out) {
  if (r.getLease() == 0) {
    ClientLease(from);
  } else if (r.getEpoch() != options_.epoch) {
    return absl::AbortedError("that lease was granted by an earlier kvpoold; register again");
  } else {
    RETURN_IF_ERROR(pools_->leases().Renew(r.getLease()));
  }
  EnvelopeBuilder reply(id);
  reply.envelope().getBody().initHeartbeatReply();
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::Status Broker::HandleJobEnd(const std::string& from, JobId job, const absl::Status& result,
                                  const wire::JobDone::Reader* done, Outbox& out) {
  auto w = worker_leases_.find(from);
  if (w == worker_leases_.end()) {
    return absl::FailedPreconditionError("job report from a peer that is not a registered worker");
  }
  auto it = jobs_.find(job);
  if (it == jobs_.end() || it->second.worker != w->second) {
    // The sender of a paired move (worker.job names it; the move may have ended already).
    if (auto sender = workers_.find(w->second);
        sender != workers_.end() && sender->second.job == job) {
      EndSend(w->second, job, result, out);
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat("job ", job, " was not given to this worker"));
  }
  absl::Status checked = result;
  if (done != nullptr && it->second.kind == JobKind::kDecode &&
      done->getOutputs().size() != it->second.sequences.size()) {
    checked = absl::InternalError(absl::StrCat("the worker returned ", done->getOutputs().size(),
                                               " outputs for ", it->second.sequences.size(),
                                               " steps"));
  }
  FinishJob(job, checked, checked.ok() ? done : nullptr, out);
  return absl::OkStatus();
}

// ---- Messages out ----

void Broker::Reply(Outbox& out, const std::string& to, EnvelopeBuilder message) {
  message.envelope().setEpoch(options_.epoch);
  const char* kind = BodyFieldName(message.envelope().getBody().which());
  out.push_back({to, message.Frame(), kind});
}

void Broker::ReplyError(Outbox& out, const std::string& to, uint64_t id,
                        const absl::Status& status) {
  ++metrics_.errors[absl::StatusCodeToString(status.code())];
  EnvelopeBuilder reply(id);
  StatusToWire(status, reply.envelope().getBody().initError());
  Reply(out, to, std::move(reply));
}


}  // namespace kvp
