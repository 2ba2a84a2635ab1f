// The Broker's leases and jobs (daemon/broker.h): leases granted, renewed and reaped, and how a
// job is queued, dispatched to a worker, re-queued when its worker goes and finished (commit and
// reply, or abort and error). The request handlers are in broker.cc.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/broker.h"  // the class whose members these are
#include "protocol/lists.h"
#include "protocol/transport_names.h"

namespace kvp {

// ---- Leases ----

LeaseId Broker::ClientLease(const std::string& identity) {
  LeaseTable& leases = pools_->leases();
  if (auto it = client_leases_.find(identity); it != client_leases_.end()) {
    if (leases.Renew(it->second).ok()) return it->second;
  }
  const LeaseId lease = leases.GrantClient(identity, options_.client_lease_micros);
  client_leases_[identity] = lease;
  client_identities_[lease] = identity;
  return lease;
}

absl::Status Broker::CheckOwnedIdle(SeqId seq, LeaseId lease) const {
  ASSIGN_OR_RETURN(const PoolIndex pool, HomeOf(seq));
  ASSIGN_OR_RETURN(LeaseId owner, pools_->pool(pool).sequences().Owner(seq));
  if (owner != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " belongs to another client"));
  }
  if (busy_.contains(seq)) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a job in flight"));
  }
  return absl::OkStatus();
}

bool Broker::HasWorker(Role role, PoolIndex pool) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w.second.role == role && w.second.pool == pool;
  });
}

bool Broker::CanRun(const Worker& worker, const Job& job) const {
  if (worker.pool != job.pool) return false;
  switch (job.kind) {
    case JobKind::kPrefill: return worker.role == Role::kPrefill;
    case JobKind::kDecode: return worker.role == Role::kDecode;
    case JobKind::kMigrate:  // by any worker, but only one with NCCL receives over it
      return !job.migration.has_value() || job.migration->transport != wire::Transport::NCCL ||
             worker.nccl;
  }
  return false;
}

bool Broker::CanRunSomewhere(const Job& job) const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [&](const auto& w) { return CanRun(w.second, job); });
}

const char* Broker::KindName(JobKind kind) {
  switch (kind) {
    case JobKind::kPrefill: return "prefill";
    case JobKind::kDecode: return "decode";
    case JobKind::kMigrate: return "migrate";
  }
  return "unknown";
}

void Broker::SetQuarantine(LeaseId lease, std::vector<uint32_t> pids) {
  quarantine_ = lease;
  quarantine_pids_ = std::move(pids);
  CheckQuarantine();
}

void Broker::CheckQuarantine() {
  if (quarantine_ == 0) return;
  std::erase_if(quarantine_pids_, [&](uint32_t pid) {
    const bool back = std::any_of(workers_.begin(), workers_.end(),
                                  [&](const auto& w) { return w.second.pid == pid; });
    return back || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
  });
  if (quarantine_pids_.empty()) EndQuarantine("the last kvpoold's workers are done");
}

void Broker::EndQuarantine(const char* why) {
  pools_->leases().Revoke(quarantine_);
  pools_->ForgetLease(quarantine_);
  spdlog::info("blocks reserved at the last kvpoold's end are free again: {}", why);
  quarantine_ = 0;
  quarantine_pids_.clear();
}

void Broker::Tick(Outbox& out) {
  CheckQuarantine();
  for (LeaseId lease : pools_->leases().Expire()) {
    ++metrics_.leases_reaped;
    if (lease == quarantine_) {
      EndQuarantine("the quarantine expired (--recovery_quarantine_ms)");
    } else if (workers_.contains(lease)) {
      EndWorker(lease, "its lease expired", out);
    } else {
      spdlog::info("client lease {} expired; its sequences are released", lease);
      EndClient(lease, out);
    }
  }
  TickPeers(out);
  Dispatch(out);
}

void Broker::ReleaseLeaseHoldings(LeaseId lease) {
  // The sequences of a client lease go; workers need not keep their tables.
  for (auto& [worker, held] : sent_tables_) {
    std::vector<SeqId>& forget = forget_[worker];
    for (auto it = held.begin(); it != held.end();) {
      const absl::StatusOr<PoolIndex> home = HomeOf(it->first);
      const absl::StatusOr<LeaseId> owner =
          home.ok() ? pools_->pool(*home).sequences().Owner(it->first) : home.status();
      if (owner.ok() && *owner == lease) {
        forget.push_back(it->first);
        held.erase(it++);
      } else {
        ++it;
      }
    }
  }
  pools_->ForgetLease(lease);
}

void Broker::EndWorker(LeaseId lease, const std::string& why, Outbox& out) {
  auto it = workers_.find(lease);
  const Worker worker = std::move(it->second);
  workers_.erase(it);
  if (auto w = worker_leases_.find(worker.identity);
      w != worker_leases_.end() && w->second == lease) {
    worker_leases_.erase(w);
  }
  pools_->leases().Revoke(lease);
  ReleaseLeaseHoldings(lease);
  sent_tables_.erase(lease);
  forget_.erase(lease);
  spdlog::warn("{} worker of pool {} pid {} (lease {}) is gone: {}", RoleName(worker.role),
               worker.pool, worker.pid, lease, why);
  CloseLinks(lease);
  if (!worker.job.has_value()) return;
  auto running = jobs_.find(*worker.job);
  if (running == jobs_.end()) return;  // the sender of a move that has ended
  Job& job = running->second;
  const bool paired = job.migration.has_value() && IsPaired(job.migration->transport);
  if (job.worker != lease) {
    // The sender of a paired move: its receiver fails (the connection drops, or the deadline
    // passes) and reports; the move ends then.
    return;
  }
  job.worker = 0;
  // A job whose client is gone is not tried again: nobody waits for it, and its blocks return
  // only when it ends (a re-queued one might wait for a worker forever). A paired move is not
  // either: its sender may still be sending to the worker that went.
  if (!job.client_gone && !paired && job.attempts < options_.max_job_attempts &&
      CanRunSomewhere(job)) {
    ++metrics_.jobs_requeued;
    queues_[static_cast<int>(job.kind)].push_front(*worker.job);
    return;
  }
  FinishJob(*worker.job,
            absl::AbortedError(absl::StrCat("the ", RoleName(worker.role), " worker of pool ",
                                            worker.pool, " running job ", *worker.job,
                                            " went away (", why, ") and no other could take it; ",
                                            "nothing was committed")),
            nullptr, out);
}

void Broker::EndClient(LeaseId lease, Outbox& out) {
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
    if (job.worker == 0 && !IsRemoteMove(job)) {  // a move to a peer runs without a worker here
      queued.push_back(id);
    } else {
      job.client_gone = true;
      ++running;
    }
  }
  usage_.erase(lease);  // its running jobs end without it
  ReleaseRemote(lease, out);  // and its sequences on other nodes go there
  // Its streams end with it; the staged blocks go with the lease's holdings.
  absl::erase_if(streams_, [&](const auto& s) { return s.second.lease == lease; });
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

void Broker::EndDeferredJob(LeaseId lease) {
  if (--deferred_[lease] == 0) {
    deferred_.erase(lease);
    ReleaseLeaseHoldings(lease);
  }
}

// ---- Jobs ----

void Broker::Enqueue(Job job, Outbox& out) {
  const JobId id = job.message.envelope().getRequestId();
  if (!job.stream_of.has_value()) ++usage_[job.client_lease].requests;  // a stream is no request
  for (SeqId s : job.sequences) busy_[s] = id;
  queues_[static_cast<int>(job.kind)].push_back(id);
  jobs_.emplace(id, std::move(job));
  Dispatch(out);
}

void Broker::StartPairedMoves(Outbox& out) {
  auto& queue = queues_[static_cast<int>(JobKind::kMigrate)];
  const std::vector<JobId> queued(queue.begin(), queue.end());
  for (JobId id : queued) {
    const Job& job = jobs_.at(id);
    if (!job.migration.has_value() || !IsPaired(job.migration->transport)) continue;
    // An idle receiver with an idle sender: a pair with an open link first.
    std::optional<std::pair<LeaseId, LeaseId>> pair;
    for (const auto& [lease, w] : workers_) {
      if (w.job.has_value() || !CanRun(w, job)) continue;
      // A move from a peer node: its sender is the peer's.
      const std::optional<LeaseId> sender =
          IsPeerImport(job) ? std::optional<LeaseId>(0) : IdleSender(job, lease);
      if (!sender.has_value()) continue;
      const bool linked = links_.contains(std::make_pair(*sender, lease));
      if (!pair.has_value() || linked) pair = std::make_pair(lease, *sender);
      if (linked) break;
    }
    if (!pair.has_value()) continue;
    std::erase(queue, id);
    Job& started = jobs_.at(id);
    started.worker = pair->first;
    ++started.attempts;
    workers_.at(pair->first).job = id;
    StartPairedMove(id, pair->first, pair->second, out);
  }
}

void Broker::Dispatch(Outbox& out) {
  // Paired moves first: their sender is a worker of the source pool that takes its own role's
  // next job the moment it is free, so a source pool kept busy would starve moves out of it.
  StartPairedMoves(out);
  StartPeerSends(out);
  for (auto& [lease, worker] : workers_) {
    if (worker.job.has_value()) continue;
    // Its role's jobs first, then migrations into its pool; the oldest of its pool in each that
    // can start (a paired move needs an idle worker of its source pool too).
    const JobKind kinds[] = {worker.role == Role::kPrefill ? JobKind::kPrefill : JobKind::kDecode,
                             JobKind::kMigrate};
    for (JobKind kind : kinds) {
      auto& queue = queues_[static_cast<int>(kind)];
      const PoolIndex pool = worker.pool;  // a structured binding: lambdas capture a copy
      const LeaseId receiver = lease;
      std::optional<LeaseId> sender;
      const auto next = std::find_if(queue.begin(), queue.end(), [&](JobId id) {
        const Job& job = jobs_.at(id);
        if (job.pool != pool) return false;
        if (!job.migration.has_value() || !IsPaired(job.migration->transport)) return true;
        sender = IsPeerImport(job) ? std::optional<LeaseId>(0) : IdleSender(job, receiver);
        return sender.has_value();
      });
      if (next == queue.end()) continue;
      const JobId id = *next;
      queue.erase(next);
      Job& job = jobs_.at(id);
      job.worker = lease;
      ++job.attempts;
      worker.job = id;
      const char* body = BodyFieldName(job.message.envelope().getBody().which());
      if (sender.has_value()) {
        StartPairedMove(id, lease, *sender, out);
      } else if (job.kind == JobKind::kDecode) {
        out.push_back({worker.identity, DecodeJobFor(job, lease).Frame(), body});
      } else {
        out.push_back({worker.identity, job.message.Frame(), body});
      }
      break;
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
    const absl::StatusOr<absl::Span<const BlockId>> blocks =
        pools_->pool(job.pool).sequences().Blocks(seq);
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
  if (ContinueSlices(id, result, out)) return;
  if (ParkBehindStream(id, result)) return;
  const int64_t started = clock_->NowMicros();
  auto node = jobs_.extract(id);
  Job& job = node.mapped();
  if (auto w = workers_.find(job.worker); w != workers_.end()) w->second.job.reset();
  for (SeqId s : job.sequences) busy_.erase(s);
  if (auto u = usage_.find(job.client_lease); u != usage_.end() && !job.stream_of.has_value()) {
    --u->second.requests;
  }
  const std::string kind = KindName(job.kind);
  if (job.migration.has_value()) NoteLinkEnd(*job.migration, job.worker, result);
  if (job.client_gone) {
    EndDeferredJob(job.client_lease);
    metrics_.ObserveJob(kind, "client_gone", 0);
    Dispatch(out);
    return;
  }
  const double seconds = (clock_->NowMicros() - job.submitted_micros) * 1e-6;
  if (job.stream_of.has_value()) {
    metrics_.ObserveJob("stream", result.ok() ? "ok" : "error", seconds);
    EndStreamMove(job, result, done != nullptr ? done->getBytes() : 0, out);
    Dispatch(out);
    return;
  }
  const SeqId seq = job.sequences.front();
  if (job.kind == JobKind::kMigrate) {
    // The import on the destination commits or aborts; the source is let go only after a commit.
    const uint64_t bytes = done != nullptr ? done->getBytes() : 0;
    const absl::Status moved = EndMigration(seq, *job.migration, result, bytes);
    metrics_.ObserveJob(kind, moved.ok() ? "ok" : "error", seconds);
    if (IsPeerImport(job)) {
      if (!moved.ok()) {
        ReplyError(out, job.client, job.request_id, moved);
      } else {
        EnvelopeBuilder reply(job.request_id);
        auto r = reply.envelope().getBody().initPeerImportReply();
        r.setSequence(seq);
        r.setLength(static_cast<uint64_t>(
            pools_->pool(job.pool).sequences().Length(seq).value_or(0)));
        r.setBytes(bytes);
        r.setPool(job.pool);
        Reply(out, job.client, std::move(reply));
      }
    } else if (job.migration->after_prefill) {
      ReplyPrefill(job.client, job.request_id, seq, job.prefix_hit_tokens, &*job.migration, moved,
                   bytes, out);
    } else if (moved.ok()) {
      ReplyMigrate(job.client, job.request_id, seq, *job.migration, bytes, out);
    } else {
      ReplyError(out, job.client, job.request_id, moved);
    }
    Dispatch(out);
    return;
  }
  SequenceTable& sequences = pools_->pool(job.pool).sequences();
  absl::Status status = result;
  if (!status.ok() && job.kind == JobKind::kDecode) {
    sent_tables_.erase(job.worker);  // what the worker holds is unknown now: send whole tables
  }
  if (status.ok()) {
    for (SeqId s : job.sequences) {
      if (absl::Status c = sequences.Commit(s); !c.ok() && status.ok()) status = c;
    }
  } else {
    for (SeqId s : job.sequences) sequences.Abort(s).IgnoreError();
  }
  metrics_.ObserveJob(kind, status.ok() ? "ok" : "error", seconds);
  if (!status.ok()) {
    ReplyError(out, job.client, job.request_id, status);
  } else if (job.kind == JobKind::kPrefill && job.then_migrate_to.has_value()) {
    // Written: now to the pool it is decoded on. The prefill's reply waits for the move.
    const AfterPrefill after{
        .prefix_hit_tokens = job.prefix_hit_tokens,
        .written_micros = job.written_micros != 0 ? job.written_micros : clock_->NowMicros()};
    const bool other_node = !job.then_migrate_node.empty();
    const absl::Status started_move =
        other_node ? StartRemoteMigration(seq, job.then_migrate_node, *job.then_migrate_to,
                                          job.client, job.request_id, job.client_lease, &after,
                                          out)
                   : StartMigration(seq, *job.then_migrate_to, job.client, job.request_id,
                                    job.client_lease, &after, out);
    EndStream(seq);  // its Import took what streamed
    if (!started_move.ok()) {
      Migration failed{.from = job.pool, .to = *job.then_migrate_to};
      failed.to_node = job.then_migrate_node;
      ReplyPrefill(job.client, job.request_id, seq, job.prefix_hit_tokens, &failed, started_move,
                   0, out);
    }
  } else if (job.kind == JobKind::kPrefill) {
    StreamBlocks(seq, out);  // a continued prefill's blocks, if it streams
    ReplyPrefill(job.client, job.request_id, seq, job.prefix_hit_tokens, nullptr,
                 absl::OkStatus(), 0, out);
  } else {
    EnvelopeBuilder reply(job.request_id);
    auto d = reply.envelope().getBody().initDecodeReply();
    d.setOutputs(done->getOutputs());
    d.setWorkerMicros(done->getExecMicros());
    d.setWorkerHandleMicros(done->getHandleMicros());
    d.setBrokerMicros(static_cast<uint64_t>(job.broker_micros + clock_->NowMicros() - started));
    Reply(out, job.client, std::move(reply));
  }
  // A failed write may have left staged copies of blocks it no longer holds: none is used again.
  if (!status.ok() && job.kind == JobKind::kPrefill) DropStream(seq);
  Dispatch(out);
}

std::string Broker::MetricsText() const {
  PoolGauges g;
  for (PoolIndex i = 0; i < pools_->size(); ++i) {
    const Pool& pool = pools_->pool(i);
    OnePoolGauges& p = g.pools.emplace_back();
    p.gpu = options_.pool_gpus[i];
    p.blocks = pool.blocks().counts();
    p.evicted = pool.blocks().evictions();
    p.sequences = pool.sequences().size();
    p.workers = {{"prefill", 0}, {"decode", 0}};
  }
  g.leases = pools_->leases().size();
  for (const auto& [lease, w] : workers_) ++g.pools[w.pool].workers[RoleName(w.role)];
  for (const auto& queue : queues_) g.jobs_queued += queue.size();
  g.jobs_running = jobs_.size() - g.jobs_queued;
  g.draining = draining_;
  const PoolSpec& spec = pools_->layout().spec();
  for (int l = 0; l < spec.num_layers; ++l) {
    g.k_scales.push_back(spec.KScale(l));
    g.v_scales.push_back(spec.VScale(l));
    g.sliding_windows.push_back(options_.model.Window(l));
  }
  g.sparse_v_threshold = options_.model.sparse_v_threshold;
  g.client_max_blocks = options_.client_max_blocks;
  g.client_max_requests = options_.client_max_requests;
  g.recovered_sequences = recovered_.sequences;
  g.recovered_blocks = recovered_.blocks;
  g.recovery_micros = recovered_.micros;
  return RenderPrometheus(metrics_, g);
}

}  // namespace kvp
