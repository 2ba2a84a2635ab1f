#include "kvpool/pool/lease_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvp {

LeaseTable::LeaseTable(const Clock* clock, int64_t expiry_micros)
    : clock_(clock), expiry_micros_(expiry_micros) {}

LeaseId LeaseTable::Grant(std::string holder) { return Grant(std::move(holder), expiry_micros_); }

LeaseId LeaseTable::Grant(std::string holder, int64_t expiry_micros) {
  const LeaseId id = next_++;
  leases_.emplace(id, Lease{std::move(holder), expiry_micros,
                            clock_->NowMicros() + expiry_micros, "", 0});
  return id;
}

LeaseId LeaseTable::GrantClient(const std::string& client, int64_t expiry_micros) {
  const LeaseId id = Grant(absl::StrCat("client ", client), expiry_micros);
  Lease& lease = leases_[id];
  lease.client = client;
  Changed(id, lease);
  return id;
}

LeaseId LeaseTable::GrantWorker(std::string holder, uint32_t pid) {
  const LeaseId id = Grant(std::move(holder));
  Lease& lease = leases_[id];
  lease.pid = pid == 0 ? 1 : pid;  // 0 marks a lease that is not a worker's
  Changed(id, lease);
  return id;
}

absl::Status LeaseTable::Renew(LeaseId lease) {
  auto it = leases_.find(lease);
  const int64_t now = clock_->NowMicros();
  if (it == leases_.end() || it->second.deadline_micros < now) {
    return absl::AbortedError(absl::StrCat("lease ", lease, " has expired; register again"));
  }
  it->second.deadline_micros = now + it->second.expiry_micros;
  return absl::OkStatus();
}

bool LeaseTable::Alive(LeaseId lease) const {
  auto it = leases_.find(lease);
  return it != leases_.end() && it->second.deadline_micros >= clock_->NowMicros();
}

const std::string* LeaseTable::Holder(LeaseId lease) const {
  auto it = leases_.find(lease);
  return it == leases_.end() ? nullptr : &it->second.holder;
}

const std::string* LeaseTable::Client(LeaseId lease) const {
  auto it = leases_.find(lease);
  return it == leases_.end() || it->second.client.empty() ? nullptr : &it->second.client;
}

bool LeaseTable::Revoke(LeaseId lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  Changed(lease, it->second);
  leases_.erase(it);
  return true;
}

void LeaseTable::Restore(const ClientLease& lease, int64_t grace_micros) {
  leases_[lease.id] = Lease{absl::StrCat("client ", lease.client), lease.expiry_micros,
                            clock_->NowMicros() + std::max(lease.expiry_micros, grace_micros),
                            lease.client, 0};
  SkipTo(lease.id + 1);
}

std::vector<LeaseTable::ClientLease> LeaseTable::ClientLeases() const {
  std::vector<ClientLease> out;
  for (const auto& [id, lease] : leases_) {
    if (!lease.client.empty()) out.push_back({id, lease.client, lease.expiry_micros});
  }
  std::sort(out.begin(), out.end(),
            [](const ClientLease& a, const ClientLease& b) { return a.id < b.id; });
  return out;
}

std::optional<LeaseTable::ClientLease> LeaseTable::FindClientLease(LeaseId lease) const {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.client.empty()) return std::nullopt;
  return ClientLease{lease, it->second.client, it->second.expiry_micros};
}

std::vector<LeaseTable::WorkerLease> LeaseTable::WorkerLeases() const {
  std::vector<WorkerLease> out;
  for (const auto& [id, lease] : leases_) {
    if (lease.pid != 0) out.push_back({id, lease.pid});
  }
  std::sort(out.begin(), out.end(),
            [](const WorkerLease& a, const WorkerLease& b) { return a.id < b.id; });
  return out;
}

std::optional<LeaseTable::WorkerLease> LeaseTable::FindWorkerLease(LeaseId lease) const {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.pid == 0) return std::nullopt;
  return WorkerLease{lease, it->second.pid};
}

std::vector<LeaseId> LeaseTable::Expire() {
  const int64_t now = clock_->NowMicros();
  std::vector<LeaseId> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.deadline_micros < now) expired.push_back(id);
  }
  for (LeaseId id : expired) {
    Changed(id, leases_[id]);
    leases_.erase(id);
  }
  return expired;
}

}  // namespace kvp
