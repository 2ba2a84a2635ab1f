#include "worker/worker_loop.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "protocol/capabilities_codec.h"
#include "protocol/dealer.h"
#include "protocol/endpoints.h"
#include "protocol/guard.h"
#include "protocol/lists.h"
#include "protocol/spec_codec.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

const char* RoleName(wire::Role role) { return role == wire::Role::PREFILL ? "prefill" : "decode"; }

struct Session {
  uint64_t lease = 0;
  uint64_t epoch = 0;
  uint32_t pool = 0;
  JobContext ctx;
  std::string fd_channel;
  int heartbeat_ms = 1000;
  int lease_expiry_ms = 3000;
  bool nccl = false;  // offered at registration: this worker can move blocks over NCCL
};

absl::StatusOr<Session> Register(Dealer& dealer, const WorkerOptions& options) {
  EnvelopeBuilder request(1);
  auto r = request.envelope().getBody().initRegister();
  r.setRole(options.role);
  r.setGpu(options.gpu);
  r.setPool(options.pool);
  r.setPid(static_cast<uint32_t>(::getpid()));
  auto caps = r.initCapabilities();
  const WorkerServes serves = ServedFor(options.backend, options.role);
  caps.setCuda(serves.cuda.has_value());
  const bool nccl = CanUseNccl(options.backend);
  caps.setNccl(nccl);
  if (serves.host.has_value()) ServedToWire(*serves.host, caps.initHostArena());
  if (serves.cuda.has_value()) ServedToWire(*serves.cuda, caps.initCudaArena());
  const std::vector<int32_t> peers = PeerGpusOf(options.gpu);
  FillList(r.initPeerGpus(static_cast<unsigned>(peers.size())), peers);
  ASSIGN_OR_RETURN(auto reply, dealer.Call(request, options.register_timeout_ms));
  const auto body = reply->envelope().getBody();
  if (!body.isRegisterReply()) return absl::InternalError("kvpoold answered Register oddly");
  const auto rr = body.getRegisterReply();
  Session s;
  s.nccl = nccl;
  s.lease = rr.getLease();
  s.epoch = rr.getEpoch();
  s.pool = rr.getPool();
  ASSIGN_OR_RETURN(s.ctx.spec, PoolSpecFromWire(rr.getSpec()));
  s.ctx.num_blocks = static_cast<int64_t>(rr.getNumBlocks());
  s.ctx.model = ModelConfigFromWire(rr.getModel());
  RETURN_IF_ERROR(ValidateModelConfig(s.ctx.model, s.ctx.spec));
  s.fd_channel = rr.getFdChannel();
  s.heartbeat_ms = static_cast<int>(std::max<uint32_t>(rr.getHeartbeatMillis(), 10));
  s.lease_expiry_ms = static_cast<int>(std::max<uint32_t>(rr.getLeaseExpiryMillis(), 30));
  return s;
}

// Heartbeats on its own socket until stopped or until kvpoold is lost; then sets `lost`.
void Heartbeats(zmq::context_t& context, const std::string& endpoint, const Session& session,
                const std::atomic<bool>& stop, std::atomic<bool>& lost) {
  Dealer dealer(context, endpoint, "");
  auto last_ok = Clock::now();
  uint64_t id = 1;
  while (!stop && !lost) {
    const auto sent = Clock::now();
    EnvelopeBuilder beat(++id);
    auto heartbeat = beat.envelope().getBody().initHeartbeat();
    heartbeat.setLease(session.lease);
    heartbeat.setEpoch(session.epoch);
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = dealer.Call(beat, session.heartbeat_ms);
    if (reply.ok()) {
      last_ok = Clock::now();
    } else if (absl::IsAborted(reply.status())) {
      spdlog::warn("kvpoold ended our lease: {}", std::string(reply.status().message()));
      lost = true;
      return;
    }
    if (Clock::now() - last_ok > std::chrono::milliseconds(session.lease_expiry_ms)) {
      spdlog::warn("kvpoold has not answered for {} ms", session.lease_expiry_ms);
      lost = true;
      return;
    }
    std::this_thread::sleep_until(sent + std::chrono::milliseconds(session.heartbeat_ms));
  }
}

uint64_t JobIdOf(wire::Envelope::Body::Reader body) {
  if (body.isPrefillJob()) return body.getPrefillJob().getJob();
  if (body.isMigrateJob()) return body.getMigrateJob().getJob();
  return body.getDecodeJob().getJob();
}

// One side of a paired move. The receiver of a fresh link opens it and tells kvpoold how the
// sender joins (TransferReady) before it waits for the bytes.
absl::StatusOr<uint64_t> MovePaired(const MigrateWork& work, uint64_t job, Attachment& attachment,
                                    Dealer& dealer) {
  ASSIGN_OR_RETURN(PairedTransport * transport, attachment.Paired(work.transport));
  if (work.link->side == wire::TransferSide::SEND) {
    RETURN_IF_ERROR(transport->Send(work));
    return attachment.BytesOf(work);
  }
  if (work.link->fresh) {
    ASSIGN_OR_RETURN(const std::string rendezvous, transport->Open(work));
    EnvelopeBuilder ready(0);
    auto r = ready.envelope().getBody().initTransferReady();
    r.setJob(job);
    r.setRendezvous(kj::arrayPtr(reinterpret_cast<const kj::byte*>(rendezvous.data()),
                                 rendezvous.size()));
    RETURN_IF_ERROR(dealer.Send(ready));
  }
  RETURN_IF_ERROR(transport->Receive(work));
  return attachment.BytesOf(work);
}

// Executes one job message; the report to send back.
EnvelopeBuilder Execute(const ParsedEnvelope& message, Clock::time_point received,
                        const JobContext& ctx, BlockTableCache& tables, Attachment& attachment,
                        Dealer& dealer) {
  const auto body = message.envelope().getBody();
  const uint64_t job = JobIdOf(body);
  Executor& executor = attachment.executor();
  EnvelopeBuilder report(message.request_id());
  std::vector<DecodeStepResult> results;
  uint64_t bytes = 0;
  // The execution time reported starts after the job is decoded and checked: that part belongs
  // to the service's overhead, not to the kernels.
  Clock::time_point start = Clock::now();
  absl::Status status = RunGuarded([&]() -> absl::Status {
    if (body.isPrefillJob()) {
      ASSIGN_OR_RETURN(const PrefillWork work, PrefillWorkFromWire(body.getPrefillJob(), ctx));
      start = Clock::now();
      return executor.Prefill(work);
    }
    if (body.isMigrateJob()) {
      ASSIGN_OR_RETURN(const MigrateWork work, MigrateWorkFromWire(body.getMigrateJob(), ctx));
      start = Clock::now();
      if (work.link.has_value()) {
        ASSIGN_OR_RETURN(bytes, MovePaired(work, job, attachment, dealer));
      } else {
        ASSIGN_OR_RETURN(bytes, attachment.PullBlocks(work));
      }
      return absl::OkStatus();
    }
    absl::StatusOr<DecodeWork> work = DecodeWorkFromWire(body.getDecodeJob(), ctx, tables);
    if (absl::IsAborted(work.status())) tables.clear();  // kvpoold resends whole tables
    if (!work.ok()) return work.status();
    start = Clock::now();
    ASSIGN_OR_RETURN(results, executor.Decode(*work));
    return absl::OkStatus();
  });
  if (absl::IsInternal(status)) tables.clear();  // a failure half-way: trust nothing held
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  if (!status.ok()) {
    spdlog::warn("job {} failed: {}", job, status.ToString());
    auto failed = report.envelope().getBody().initJobFailed();
    failed.setJob(job);
    StatusToWire(status, failed.initError());
    return report;
  }
  auto done = report.envelope().getBody().initJobDone();
  done.setJob(job);
  done.setExecMicros(static_cast<uint64_t>(micros));
  done.setBytes(bytes);
  DecodeResultsToWire(results, static_cast<uint32_t>(ctx.model.num_q_heads),
                      static_cast<uint32_t>(ctx.spec.head_dim), done.initOutputs(results.size()));
  done.setHandleMicros(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - received).count()));
  return report;
}

}  // namespace

absl::Status WorkerLoop::Run(const std::atomic<bool>& stop) {
  zmq::context_t context(1);
  const std::string role = RoleName(options_.role);
  bool waiting_logged = false;
  // The last session's arena, kept mapped while kvpoold is away: it holds the memory, and a
  // restarted kvpoold without systemd's fd store takes it back from us (docs/design.md §10).
  std::unique_ptr<Attachment> previous;
  std::string previous_channel;
  const auto offer_previous = [&] {
    if (previous == nullptr) return;
    const std::string back = ReturnChannelBeside(previous_channel);
    if (::access(back.c_str(), F_OK) != 0) return;  // kvpoold is not asking
    const absl::Status handed = previous->HandBack(back);
    if (absl::IsUnavailable(handed)) return;  // try again while waiting
    if (handed.ok()) {
      spdlog::info("handed the arena of our pool back to the restarted kvpoold");
    } else {
      spdlog::info("kvpoold did not need our arena: {}", std::string(handed.message()));
    }
    previous.reset();
  };
  for (int session_number = 1; !stop; ++session_number) {
    const std::string identity =
        absl::StrCat("worker-", role, "-", ::getpid(), "-", session_number);
    Dealer dealer(context, options_.endpoint, identity);
    absl::StatusOr<Session> session = Register(dealer, options_);
    if (!session.ok()) {
      if (absl::IsUnimplemented(session.status()) || absl::IsInvalidArgument(session.status())) {
        return session.status();  // this worker cannot serve this pool
      }
      if (!waiting_logged) {
        spdlog::info("waiting for kvpoold at {} ({})", options_.endpoint,
                     std::string(session.status().message()));
        waiting_logged = true;
      }
      offer_previous();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    waiting_logged = false;
    absl::StatusOr<std::unique_ptr<Attachment>> attachment =
        Attach(session->fd_channel, options_.backend, options_.gpu, session->ctx, session->epoch,
               options_.sockets);
    if (!attachment.ok()) {
      if (absl::IsFailedPrecondition(attachment.status())) return attachment.status();
      spdlog::warn("attach failed, registering again: {}", attachment.status().ToString());
      continue;
    }
    previous.reset();  // kvpoold has its arena again
    spdlog::info("registered: role={} pool={} lease={} backend={} nccl={} blocks={} {}", role,
                 session->pool, session->lease, (*attachment)->backend_name(),
                 session->nccl ? "yes" : "no", session->ctx.num_blocks,
                 session->ctx.spec.DebugString());
    // Jobs are checked against this pool's shape before any field is read.
    WireLimits limits;
    limits.max_layers = static_cast<uint64_t>(session->ctx.spec.num_layers);
    limits.max_blocks = static_cast<uint64_t>(session->ctx.num_blocks);
    dealer.set_limits(limits);
    BlockTableCache tables;  // as kvpoold sent them in this registration
    std::atomic<bool> lost = false;
    std::thread heartbeats(Heartbeats, std::ref(context), std::cref(options_.endpoint),
                           std::cref(*session), std::cref(stop), std::ref(lost));
    while (!stop && !lost) {
      absl::StatusOr<std::unique_ptr<ParsedEnvelope>> message = dealer.Receive(100);
      const auto received = Clock::now();
      if (absl::IsDeadlineExceeded(message.status()) || absl::IsCancelled(message.status())) {
        continue;  // a timeout, or a signal: look at `stop` and `lost` again
      }
      if (absl::IsUnavailable(message.status())) {
        lost = true;  // the connection dropped: register again as soon as kvpoold is back
        break;
      }
      if (!message.ok()) {
        spdlog::warn("dropped a message from kvpoold: {}", message.status().ToString());
        continue;
      }
      const auto body = (*message)->envelope().getBody();
      if (body.isPrefillJob() || body.isDecodeJob() || body.isMigrateJob()) {
        const EnvelopeBuilder report =
            Execute(**message, received, session->ctx, tables, **attachment, dealer);
        if (absl::Status s = dealer.Send(report); !s.ok()) {
          spdlog::warn("could not report job: {}", s.ToString());
        }
      } else if (body.isError()) {
        spdlog::warn("kvpoold: {}", StatusFromWire(body.getError()).ToString());
      }
    }
    heartbeats.join();
    if (lost) {
      spdlog::warn("lost kvpoold; keeping the arena mapped and registering again");
      previous = *std::move(attachment);
      previous_channel = session->fd_channel;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp
