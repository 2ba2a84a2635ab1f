#include "kvpool/pool/lease_table.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvp {

LeaseTable::LeaseTable(const Clock* clock, int64_t expiry_micros)
    : clock_(clock), expiry_micros_(expiry_micros) {}

LeaseId LeaseTable::Grant(std::string holder) { return Grant(std::move(holder), expiry_micros_); }

LeaseId LeaseTable::Grant(std::string holder, int64_t expiry_micros) {
  const LeaseId id = next_++;
  leases_.emplace(id, Lease{std::move(holder), expiry_micros, clock_->NowMicros() + expiry_micros});
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

bool LeaseTable::Revoke(LeaseId lease) { return leases_.erase(lease) > 0; }

std::vector<LeaseId> LeaseTable::Expire() {
  const int64_t now = clock_->NowMicros();
  std::vector<LeaseId> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.deadline_micros < now) expired.push_back(id);
  }
  for (LeaseId id : expired) leases_.erase(id);
  return expired;
}

}  // namespace kvp
