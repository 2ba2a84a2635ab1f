#include "daemon/broker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/kv_format_names.h"
#include "protocol/activations_codec.h"
#include "protocol/capabilities_codec.h"
#include "protocol/finite_check.h"
#include "protocol/guard.h"
#include "protocol/lists.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

const char* RoleName(int role) { return role == 0 ? "prefill" : "decode"; }

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

Broker::Broker(Pool* pool, const Clock* clock, BrokerOptions options)
    : pool_(pool), clock_(clock), options_(std::move(options)) {}

// ---- Messages in ----

void Broker::Handle(const std::string& from, std::vector<zmq::message_t> frames, Outbox& out) {
  uint64_t readable_id = 0;
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> parsed =
      ParseEnvelope(std::move(frames), options_.limits, &readable_id);
  if (!parsed.ok()) {
    ++metrics_.requests["malformed"];
    ReplyError(out, from, readable_id, parsed.status());
    return;
  }
  const wire::Envelope::Reader envelope = (*parsed)->envelope();
  const char* kind = BodyName(envelope.getBody().which());
  ++metrics_.requests[kind];
  absl::Status status = RunGuarded([&] { return Route(from, envelope, out); });
  if (absl::IsInternal(status)) {
    spdlog::error("{} from {} failed: {}", kind, from, status.ToString());
  }
  if (status.ok()) return;
  // A client that names the epoch it last heard from learns why its sequence is unknown.
  const uint64_t seen = envelope.getEpoch();
  if (absl::IsNotFound(status) && seen != 0 && seen != options_.epoch) {
    status = absl::NotFoundError(absl::StrCat(
        status.message(), ": the kvpoold this client last heard from (epoch ", seen,
        ") has restarted, and this one (epoch ", options_.epoch,
        ") did not keep its sequences; prefill again"));
  }
  ReplyError(out, from, envelope.getRequestId(), status);
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
    RETURN_IF_ERROR(CheckActivations(r.getActivations(), pool_->layout().spec(), count_in));
    RETURN_IF_ERROR(CheckValues(r.getActivations()));
    digests = digester_.TokenDigests(r.getActivations(), 0, count_in);
  }
  if (!HasWorker(Role::kPrefill)) return absl::UnavailableError("no prefill worker is registered");
  RETURN_IF_ERROR(CheckRequestLimit(ClientLease(from)));
  const std::vector<int32_t> tokens = ListToVector<int32_t>(r.getTokens());
  SequenceTable& sequences = pool_->sequences();
  const int64_t length_before = sequences.Length(seq).value_or(0);
  const SharingScope scope{.root = digester_.NamespaceRoot(r.getCacheNamespace().cStr()),
                           .shared = true};
  ASSIGN_OR_RETURN(AppendPlan plan, PlanAppend(from, seq, tokens, digests, scope));
  ASSIGN_OR_RETURN(const LeaseId lease, sequences.Owner(seq));  // the client's, as PlanAppend found it
  const int32_t hits = plan.prefix_hit_tokens;
  if (plan.slots.empty()) {  // every token was a prefix hit
    RETURN_IF_ERROR(sequences.Commit(seq));
    EnvelopeBuilder reply(id);
    auto p = reply.envelope().getBody().initPrefillReply();
    p.setSequence(seq);
    p.setLength(sequences.Length(seq).value_or(0));
    p.setPrefixHitTokens(hits);
    Reply(out, from, std::move(reply));
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
  Enqueue(Job{.role = Role::kPrefill,
              .client = from,
              .request_id = id,
              .client_lease = lease,
              .sequences = {seq},
              .prefix_hit_tokens = hits,
              .message = std::move(message),
              .submitted_micros = clock_->NowMicros()},
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
  if (!HasWorker(Role::kDecode)) return absl::UnavailableError("no decode worker is registered");
  const int64_t started = clock_->NowMicros();
  const PoolSpec& spec = pool_->layout().spec();
  SequenceTable& sequences = pool_->sequences();
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
  Enqueue(Job{.role = Role::kDecode,
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
  ASSIGN_OR_RETURN(AppendPlan plan,
                   PlanAppend(from, seq, ListToVector<int32_t>(r.getTokens()), digests, scope));
  EnvelopeBuilder reply(id);
  auto a = reply.envelope().getBody().initAppendReply();
  a.setPrefixHitTokens(plan.prefix_hit_tokens);
  FillList(a.initSlots(plan.slots.size()), plan.slots);
  SetCopies(plan.copies, a.initCopies(plan.copies.size()));
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> blocks, pool_->sequences().Blocks(seq));
  FillList(a.initBlockTable(blocks.size()), blocks);
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::StatusOr<AppendPlan> Broker::PlanAppend(const std::string& from, SeqId seq,
                                               const std::vector<int32_t>& tokens,
                                               absl::Span<const TokenDigest> digests,
                                               const SharingScope& scope) {
  if (busy_.contains(seq)) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a job in flight"));
  }
  const LeaseId lease = ClientLease(from);
  ASSIGN_OR_RETURN(AppendPlan plan, pool_->sequences().Append(seq, lease, tokens, digests, scope));
  if (absl::Status limit = CheckBlockLimit(lease); !limit.ok()) {
    pool_->sequences().Abort(seq).IgnoreError();
    return limit;
  }
  const int64_t hit_blocks = plan.prefix_hit_tokens / pool_->layout().spec().block_size;
  metrics_.prefix_hit_tokens += plan.prefix_hit_tokens;
  metrics_.prefix_hit_blocks += hit_blocks;
  usage_[lease].prefix_hit_blocks += hit_blocks;
  return plan;
}

absl::Status Broker::CheckBlockLimit(LeaseId lease) const {
  const int64_t held = pool_->blocks().HeldBy(lease);
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
  SequenceTable& sequences = pool_->sequences();
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
  RETURN_IF_ERROR(CheckOwnedIdle(seq, ClientLease(from)));
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> held, pool_->sequences().Blocks(seq));
  const size_t blocks = held.size();
  RETURN_IF_ERROR(pool_->sequences().Release(seq));
  ForgetTables(seq);
  EnvelopeBuilder reply(id);
  reply.envelope().getBody().initReleaseReply().setReleasedBlocks(static_cast<uint32_t>(blocks));
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

absl::Status Broker::HandleFork(const std::string& from, uint64_t id, wire::ForkRequest::Reader r,
                                Outbox& out) {
  const LeaseId lease = ClientLease(from);
  RETURN_IF_ERROR(CheckOwnedIdle(r.getSource(), lease));
  RETURN_IF_ERROR(pool_->sequences().Fork(r.getSource(), r.getTarget(), lease));
  ASSIGN_OR_RETURN(const absl::Span<const BlockId> shared, pool_->sequences().Blocks(r.getTarget()));
  EnvelopeBuilder reply(id);
  reply.envelope().getBody().initForkReply().setSharedBlocks(static_cast<uint32_t>(shared.size()));
  Reply(out, from, std::move(reply));
  return absl::OkStatus();
}

void Broker::ReplyStats(const std::string& from, uint64_t id, Outbox& out) {
  const LeaseId lease = ClientLease(from);
  const ClientUsage usage = usage_.contains(lease) ? usage_.at(lease) : ClientUsage();
  const PoolCounts c = pool_->blocks().counts();
  EnvelopeBuilder reply(id);
  auto s = reply.envelope().getBody().initStatsReply();
  s.setBlocksFree(c.free);
  s.setBlocksReserved(c.reserved);
  s.setBlocksUsed(c.used);
  s.setBlocksCached(c.cached);
  // Hits are the client's own: another namespace's, or another client's, are none of its business.
  s.setPrefixHitBlocks(usage.prefix_hit_blocks);
  s.setLeases(static_cast<uint32_t>(pool_->leases().size()));
  s.setSequences(static_cast<uint32_t>(pool_->sequences().size()));
  s.setClientBlocks(static_cast<uint64_t>(pool_->blocks().HeldBy(lease)));
  s.setClientRequestsInFlight(static_cast<uint32_t>(usage.requests));
  s.setRejectedNonFinite(metrics_.rejected_nonfinite);
  Reply(out, from, std::move(reply));
}

void Broker::ReplyHealth(const std::string& from, uint64_t id, Outbox& out) {
  EnvelopeBuilder reply(id);
  auto h = reply.envelope().getBody().initHealthReply();
  h.setReady(!draining_);
  h.setEpoch(options_.epoch);
  h.setWorkers(static_cast<uint32_t>(workers_.size()));
  h.setDraining(draining_);
  PoolSpecToWire(pool_->layout().spec(), h.initSpec());
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
  const PoolSpec& spec = pool_->layout().spec();
  RETURN_IF_ERROR(CheckCapabilities(r.getCapabilities(), spec, options_.gpu >= 0));
  if (auto it = worker_leases_.find(from); it != worker_leases_.end()) {
    EndWorker(it->second, "registered again", out);
  }
  const Role role = r.getRole() == wire::Role::PREFILL ? Role::kPrefill : Role::kDecode;
  const LeaseId lease = pool_->leases().Grant(
      absl::StrCat(RoleName(static_cast<int>(role)), " worker pid ", r.getPid()));
  workers_.emplace(lease, Worker{.identity = from, .role = role, .gpu = r.getGpu(),
                                 .pid = r.getPid(), .job = std::nullopt});
  worker_leases_[from] = lease;
  spdlog::info("worker registered: role={} pid={} gpu={} lease={}",
               RoleName(static_cast<int>(role)), r.getPid(), r.getGpu(), lease);
  EnvelopeBuilder reply(id);
  auto rr = reply.envelope().getBody().initRegisterReply();
  rr.setLease(lease);
  PoolSpecToWire(spec, rr.initSpec());
  rr.setNumBlocks(static_cast<uint64_t>(pool_->blocks().num_blocks()));
  rr.setFdChannel(options_.fd_channel_path);
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
    RETURN_IF_ERROR(pool_->leases().Renew(r.getLease()));
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
    return absl::NotFoundError(absl::StrCat("job ", job, " was not given to this worker"));
  }
  absl::Status checked = result;
  if (done != nullptr && it->second.role == Role::kDecode &&
      done->getOutputs().size() != it->second.sequences.size()) {
    checked = absl::InternalError(absl::StrCat("the worker returned ", done->getOutputs().size(),
                                               " outputs for ", it->second.sequences.size(),
                                               " steps"));
  }
  FinishJob(job, checked, checked.ok() ? done : nullptr, out);
  return absl::OkStatus();
}

// ---- Leases ----

LeaseId Broker::ClientLease(const std::string& identity) {
  LeaseTable& leases = pool_->leases();
  if (auto it = client_leases_.find(identity); it != client_leases_.end()) {
    if (leases.Renew(it->second).ok()) return it->second;
  }
  const LeaseId lease = leases.Grant(absl::StrCat("client ", identity), options_.client_lease_micros);
  client_leases_[identity] = lease;
  client_identities_[lease] = identity;
  return lease;
}

absl::Status Broker::CheckOwnedIdle(SeqId seq, LeaseId lease) const {
  ASSIGN_OR_RETURN(LeaseId owner, pool_->sequences().Owner(seq));
  if (owner != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " belongs to another client"));
  }
  if (busy_.contains(seq)) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a job in flight"));
  }
  return absl::OkStatus();
}

bool Broker::HasWorker(Role role) const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [&](const auto& w) { return w.second.role == role; });
}

void Broker::Tick(Outbox& out) {
  for (LeaseId lease : pool_->leases().Expire()) {
    ++metrics_.leases_reaped;
    if (workers_.contains(lease)) {
      EndWorker(lease, "its lease expired", out);
    } else {
      spdlog::info("client lease {} expired; its sequences are released", lease);
      EndClient(lease);
    }
  }
  Dispatch(out);
}

void Broker::ReleaseLeaseHoldings(LeaseId lease) {
  // The sequences of a client lease go; workers need not keep their tables.
  for (auto& [worker, held] : sent_tables_) {
    std::vector<SeqId>& forget = forget_[worker];
    for (auto it = held.begin(); it != held.end();) {
      auto owner = pool_->sequences().Owner(it->first);
      if (owner.ok() && *owner == lease) {
        forget.push_back(it->first);
        held.erase(it++);
      } else {
        ++it;
      }
    }
  }
  pool_->sequences().ForgetLease(lease);
  pool_->blocks().ReleaseLease(lease);
}

void Broker::EndWorker(LeaseId lease, const std::string& why, Outbox& out) {
  auto it = workers_.find(lease);
  const Worker worker = std::move(it->second);
  workers_.erase(it);
  if (auto w = worker_leases_.find(worker.identity); w != worker_leases_.end() && w->second == lease) {
    worker_leases_.erase(w);
  }
  pool_->leases().Revoke(lease);
  ReleaseLeaseHoldings(lease);
  sent_tables_.erase(lease);
  forget_.erase(lease);
  spdlog::warn("{} worker pid {} (lease {}) is gone: {}", RoleName(static_cast<int>(worker.role)),
               worker.pid, lease, why);
  if (!worker.job.has_value()) return;
  Job& job = jobs_.at(*worker.job);
  job.worker = 0;
  // A job whose client is gone is not tried again: nobody waits for it, and its blocks return
  // only when it ends (a re-queued one might wait for a worker forever).
  if (!job.client_gone && job.attempts < options_.max_job_attempts && HasWorker(worker.role)) {
    ++metrics_.jobs_requeued;
    queues_[static_cast<int>(worker.role)].push_front(*worker.job);
    return;
  }
  FinishJob(*worker.job,
            absl::AbortedError(absl::StrCat(
                "the ", RoleName(static_cast<int>(worker.role)), " worker running job ",
                *worker.job, " went away (", why, ") and no other could take it; nothing was "
                "committed")),
            nullptr, out);
}

void Broker::EndClient(LeaseId lease) {
  if (auto it = client_identities_.find(lease); it != client_identities_.end()) {
    if (auto c = client_leases_.find(it->second); c != client_leases_.end() && c->second == lease) {
      client_leases_.erase(c);
    }
    client_identities_.erase(it);
  }
  int running = 0;
  std::vector<JobId> queued;
  for (auto& [id, job] : jobs_) {
    if (job.client_lease != lease) continue;
    if (job.worker == 0) {
      queued.push_back(id);
    } else {
      job.client_gone = true;
      ++running;
    }
  }
  usage_.erase(lease);  // its running jobs end without it
  for (JobId id : queued) {
    for (SeqId s : jobs_.at(id).sequences) busy_.erase(s);
    for (auto& q : queues_) q.erase(std::remove(q.begin(), q.end(), id), q.end());
    jobs_.erase(id);
  }
  if (running == 0) {
    ReleaseLeaseHoldings(lease);
  } else {
    deferred_[lease] = running;  // the running jobs' blocks return when they end
  }
}

// ---- Jobs ----

void Broker::Enqueue(Job job, Outbox& out) {
  const JobId id = job.message.envelope().getRequestId();
  ++usage_[job.client_lease].requests;
  for (SeqId s : job.sequences) busy_[s] = id;
  queues_[static_cast<int>(job.role)].push_back(id);
  jobs_.emplace(id, std::move(job));
  Dispatch(out);
}

void Broker::Dispatch(Outbox& out) {
  for (auto& [lease, worker] : workers_) {
    auto& queue = queues_[static_cast<int>(worker.role)];
    if (worker.job.has_value() || queue.empty()) continue;
    const JobId id = queue.front();
    queue.pop_front();
    Job& job = jobs_.at(id);
    job.worker = lease;
    ++job.attempts;
    worker.job = id;
    if (job.role == Role::kDecode) {
      out.push_back({worker.identity, DecodeJobFor(job, lease).Frame()});
    } else {
      out.push_back({worker.identity, job.message.Frame()});
    }
  }
}

EnvelopeBuilder Broker::DecodeJobFor(const Job& job, LeaseId worker) {
  EnvelopeBuilder message(job.message.request_id());
  message.envelope().getBody().setDecodeJob(job.message.reader().getBody().getDecodeJob());
  auto dj = message.envelope().getBody().getDecodeJob();
  auto& held = sent_tables_[worker];
  auto steps = dj.getSteps();
  for (unsigned i = 0; i < steps.size(); ++i) {
    const SeqId seq = steps[i].getSequence();
    // A job's sequences outlive it (EndClient defers a running job's); were one gone, its empty
    // table would fail the step at the worker rather than here.
    const absl::StatusOr<absl::Span<const BlockId>> blocks = pool_->sequences().Blocks(seq);
    const absl::Span<const BlockId> table = blocks.ok() ? *blocks : absl::Span<const BlockId>();
    HeldBlockTable& known = held[seq];
    const size_t from = CommonPrefix(known.blocks(), table);
    known.Replace(from, table.subspan(from));
    steps[i].setBlockTableFrom(static_cast<uint32_t>(from));
    steps[i].setBlockTableHash(known.hash());
    FillList(steps[i].initBlockTable(table.size() - from), table.subspan(from));
  }
  if (auto f = forget_.find(worker); f != forget_.end()) {
    FillList(dj.initForget(f->second.size()), f->second);
    forget_.erase(f);
  }
  return message;
}

void Broker::ForgetTables(SeqId seq) {
  for (auto& [worker, held] : sent_tables_) {
    if (held.erase(seq) > 0) forget_[worker].push_back(seq);
  }
}

void Broker::FinishJob(JobId id, const absl::Status& result, const wire::JobDone::Reader* done,
                       Outbox& out) {
  const int64_t started = clock_->NowMicros();
  auto node = jobs_.extract(id);
  Job& job = node.mapped();
  if (auto w = workers_.find(job.worker); w != workers_.end()) w->second.job.reset();
  for (SeqId s : job.sequences) busy_.erase(s);
  if (auto u = usage_.find(job.client_lease); u != usage_.end()) --u->second.requests;
  const std::string kind = RoleName(static_cast<int>(job.role));
  if (job.client_gone) {
    if (--deferred_[job.client_lease] == 0) {
      deferred_.erase(job.client_lease);
      ReleaseLeaseHoldings(job.client_lease);
    }
    metrics_.ObserveJob(kind, "client_gone", 0);
    Dispatch(out);
    return;
  }
  SequenceTable& sequences = pool_->sequences();
  absl::Status status = result;
  if (!status.ok() && job.role == Role::kDecode) {
    sent_tables_.erase(job.worker);  // what the worker holds is unknown now: send whole tables
  }
  if (status.ok()) {
    for (SeqId s : job.sequences) {
      if (absl::Status c = sequences.Commit(s); !c.ok() && status.ok()) status = c;
    }
  } else {
    for (SeqId s : job.sequences) sequences.Abort(s).IgnoreError();
  }
  const double seconds = (clock_->NowMicros() - job.submitted_micros) * 1e-6;
  metrics_.ObserveJob(kind, status.ok() ? "ok" : "error", seconds);
  if (!status.ok()) {
    ReplyError(out, job.client, job.request_id, status);
  } else if (job.role == Role::kPrefill) {
    EnvelopeBuilder reply(job.request_id);
    auto p = reply.envelope().getBody().initPrefillReply();
    const SeqId seq = job.sequences.front();
    p.setSequence(seq);
    p.setLength(static_cast<uint64_t>(sequences.Length(seq).value_or(0)));
    p.setPrefixHitTokens(static_cast<uint32_t>(job.prefix_hit_tokens));
    Reply(out, job.client, std::move(reply));
  } else {
    EnvelopeBuilder reply(job.request_id);
    auto d = reply.envelope().getBody().initDecodeReply();
    d.setOutputs(done->getOutputs());
    d.setWorkerMicros(done->getExecMicros());
    d.setWorkerHandleMicros(done->getHandleMicros());
    d.setBrokerMicros(static_cast<uint64_t>(job.broker_micros + clock_->NowMicros() - started));
    Reply(out, job.client, std::move(reply));
  }
  Dispatch(out);
}

// ---- Messages out ----

void Broker::Reply(Outbox& out, const std::string& to, EnvelopeBuilder message) {
  message.envelope().setEpoch(options_.epoch);
  out.push_back({to, message.Frame()});
}

void Broker::ReplyError(Outbox& out, const std::string& to, uint64_t id,
                        const absl::Status& status) {
  ++metrics_.errors[absl::StatusCodeToString(status.code())];
  EnvelopeBuilder reply(id);
  StatusToWire(status, reply.envelope().getBody().initError());
  Reply(out, to, std::move(reply));
}

std::string Broker::MetricsText() const {
  PoolGauges g;
  g.gpu = options_.gpu;
  g.blocks = pool_->blocks().counts();
  g.leases = pool_->leases().size();
  g.sequences = pool_->sequences().size();
  g.workers = {{"prefill", 0}, {"decode", 0}};
  for (const auto& [lease, w] : workers_) ++g.workers[RoleName(static_cast<int>(w.role))];
  g.jobs_queued = queues_[0].size() + queues_[1].size();
  g.jobs_running = jobs_.size() - g.jobs_queued;
  g.draining = draining_;
  const PoolSpec& spec = pool_->layout().spec();
  for (int l = 0; l < spec.num_layers; ++l) {
    g.k_scales.push_back(spec.KScale(l));
    g.v_scales.push_back(spec.VScale(l));
    g.sliding_windows.push_back(options_.model.Window(l));
  }
  g.sparse_v_threshold = options_.model.sparse_v_threshold;
  g.client_max_blocks = options_.client_max_blocks;
  g.client_max_requests = options_.client_max_requests;
  return RenderPrometheus(metrics_, g);
}

}  // namespace kvp
