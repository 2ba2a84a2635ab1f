// The Broker's paired moves (daemon/broker.h, docs/design.md §6): a migration over nccl or socket
// runs as two jobs, a receive job on a worker of the destination pool and a send job on a worker of
// the source pool, joined by a link. Both workers are taken at once, so that neither waits on a
// peer that is busy with something else; the receiver's report ends the move, the sender's only
// frees the sender. Links that carried a move (NCCL communicators) are reused by the same pair.
#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/broker.h"  // the class whose members these are
#include "protocol/transport_names.h"

namespace kvp {
namespace {

constexpr size_t kTokenBytes = 32;
// Link ids of moves from other nodes, apart from this kvpoold's own pairs' (workers key NCCL
// communicators by link id).
constexpr uint64_t kPeerLinkBit = uint64_t{1} << 63;
const char* const kMigrateJob = BodyFieldName(wire::Envelope::Body::MIGRATE_JOB);

// A secret for the socket link: only the sender kvpoold told can pass as it.
std::string NewToken() {
  std::string token(kTokenBytes, '\0');
  size_t filled = 0;
  while (filled < token.size()) {
    const ssize_t n = ::getrandom(token.data() + filled, token.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return token;
}

kj::ArrayPtr<const kj::byte> BytesOf(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

}  // namespace

std::optional<LeaseId> Broker::IdleSender(const Job& job, LeaseId receiver) const {
  std::optional<LeaseId> any;
  for (const auto& [lease, w] : workers_) {
    if (w.pool != job.migration->from || w.job.has_value() || lease == receiver) continue;
    if (job.migration->transport == wire::Transport::NCCL && !w.nccl) continue;
    if (links_.contains(std::make_pair(lease, receiver))) return lease;
    if (!any.has_value()) any = lease;
  }
  return any;
}

EnvelopeBuilder Broker::LinkJobFor(const Job& job, wire::TransferSide side,
                                   kj::ArrayPtr<const kj::byte> rendezvous) const {
  const Migration& m = *job.migration;
  EnvelopeBuilder message(job.message.request_id());
  message.envelope().getBody().setMigrateJob(job.message.reader().getBody().getMigrateJob());
  auto link = message.envelope().getBody().getMigrateJob().initLink();
  link.setSide(side);
  link.setId(m.link);
  link.setFresh(m.fresh_link);
  link.setRendezvous(rendezvous);
  if (m.transport == wire::Transport::SOCKET) link.setToken(BytesOf(m.token));
  link.setDeadlineMillis(static_cast<uint32_t>(options_.transfer_timeout_millis));
  link.setSourceChunkBytes(m.from_peer.empty() ? ChunkBytesOf(m.from) : m.peer_chunk_bytes);
  link.setTargetChunkBytes(ChunkBytesOf(m.to));
  return message;
}

void Broker::StartPairedMove(JobId id, LeaseId receiver, LeaseId sender, Outbox& out) {
  Job& job = jobs_.at(id);
  Migration& m = *job.migration;
  if (!m.from_peer.empty()) {
    // From another node: a fresh link of its own numbering, whose send half goes to the peer
    // kvpoold once the receiver has opened it (HandleTransferReady).
    m.fresh_link = true;
    m.link = kPeerLinkBit | next_link_++;
    if (m.transport == wire::Transport::SOCKET) m.token = NewToken();
    out.push_back({workers_.at(receiver).identity,
                   LinkJobFor(job, wire::TransferSide::RECEIVE, {}).Frame(), kMigrateJob});
    return;
  }
  m.sender = sender;
  workers_.at(sender).job = id;
  const auto open = links_.find(std::make_pair(sender, receiver));
  m.fresh_link = m.transport != wire::Transport::NCCL || open == links_.end();
  m.link = m.fresh_link ? next_link_++ : open->second;
  if (m.transport == wire::Transport::SOCKET) m.token = NewToken();
  out.push_back({workers_.at(receiver).identity,
                 LinkJobFor(job, wire::TransferSide::RECEIVE, {}).Frame(), kMigrateJob});
  if (!m.fresh_link) {
    out.push_back({workers_.at(sender).identity,
                   LinkJobFor(job, wire::TransferSide::SEND, {}).Frame(), kMigrateJob});
    m.send_sent = true;
  }
}

absl::Status Broker::HandleTransferReady(const std::string& from, wire::TransferReady::Reader r,
                                         Outbox& out) {
  auto w = worker_leases_.find(from);
  if (w == worker_leases_.end()) {
    return absl::FailedPreconditionError("TransferReady from a peer that is not a worker");
  }
  auto it = jobs_.find(r.getJob());
  if (it == jobs_.end() || it->second.worker != w->second || !it->second.migration.has_value() ||
      !IsPaired(it->second.migration->transport)) {
    return absl::NotFoundError(
        absl::StrCat("job ", r.getJob(), " is no paired move this worker receives"));
  }
  Job& job = it->second;
  Migration& m = *job.migration;
  if (!m.fresh_link || m.send_sent) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", r.getJob(), ": its link was opened already"));
  }
  if (!m.from_peer.empty()) {
    // The sender is another node's: its kvpoold gets the send half, under its request's id.
    EnvelopeBuilder half(m.peer_call);
    half.envelope().getBody().setMigrateJob(
        LinkJobFor(job, wire::TransferSide::SEND, r.getRendezvous()).reader().getBody()
            .getMigrateJob());
    Reply(out, job.client, std::move(half));
    m.send_sent = true;
    return absl::OkStatus();
  }
  if (!workers_.contains(m.sender)) {
    // The sender went: the receiver's wait ends at the link's deadline and the move fails.
    spdlog::warn("job {}: the sender is gone; the move will fail at its deadline", r.getJob());
    return absl::OkStatus();
  }
  out.push_back({workers_.at(m.sender).identity,
                 LinkJobFor(job, wire::TransferSide::SEND, r.getRendezvous()).Frame(),
                 kMigrateJob});
  m.send_sent = true;
  return absl::OkStatus();
}

void Broker::EndSend(LeaseId sender, JobId id, const absl::Status& result, Outbox& out) {
  if (auto w = workers_.find(sender); w != workers_.end()) w->second.job.reset();
  if (!result.ok()) {
    spdlog::warn("job {}: the sending worker (lease {}) failed: {}", id, sender,
                 result.ToString());
    CloseLinks(sender);
  }
  Dispatch(out);
}

void Broker::NoteLinkEnd(const Migration& m, LeaseId receiver, const absl::Status& result) {
  if (!IsPaired(m.transport) || m.sender == 0) return;
  const auto pair = std::make_pair(m.sender, receiver);
  if (result.ok() && m.transport == wire::Transport::NCCL && workers_.contains(m.sender)) {
    links_[pair] = m.link;  // both sides keep the communicator
  } else {
    links_.erase(pair);
  }
}

void Broker::CloseLinks(LeaseId lease) {
  absl::erase_if(links_, [lease](const auto& link) {
    return link.first.first == lease || link.first.second == lease;
  });
}

}  // namespace kvp
