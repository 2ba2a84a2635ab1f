#include "kvpool/pool/pool_set.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {

absl::StatusOr<std::unique_ptr<PoolSet>> PoolSet::Create(const PoolSpec& spec,
                                                         uint64_t arena_bytes, int num_pools,
                                                         const Clock* clock,
                                                         int64_t lease_expiry_micros) {
  if (num_pools < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kvpoold needs 1 pool or more, not ", num_pools));
  }
  if (lease_expiry_micros <= 0) {
    return absl::InvalidArgumentError("the lease expiry must be positive");
  }
  std::vector<std::unique_ptr<Pool>> pools;
  for (int i = 0; i < num_pools; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Create(spec, arena_bytes));
    pools.push_back(std::move(pool));
  }
  return std::unique_ptr<PoolSet>(new PoolSet(std::move(pools), clock, lease_expiry_micros));
}

PoolSet::PoolSet(std::vector<std::unique_ptr<Pool>> pools, const Clock* clock,
                 int64_t lease_expiry_micros)
    : pools_(std::move(pools)), leases_(clock, lease_expiry_micros) {}

std::optional<PoolIndex> PoolSet::Home(SeqId seq) const {
  for (PoolIndex i = 0; i < pools_.size(); ++i) {
    const SequenceTable& t = pools_[i]->sequences();
    if (t.Contains(seq) && !t.Importing(seq)) return i;
  }
  return std::nullopt;
}

void PoolSet::ForgetLease(LeaseId lease) {
  for (auto& pool : pools_) pool->ForgetLease(lease);
}

PoolCounts PoolSet::counts() const {
  PoolCounts sum;
  for (const auto& pool : pools_) {
    const PoolCounts c = pool->blocks().counts();
    sum.free += c.free;
    sum.reserved += c.reserved;
    sum.used += c.used;
    sum.cached += c.cached;
  }
  return sum;
}

int64_t PoolSet::HeldBy(LeaseId lease) const {
  int64_t held = 0;
  for (const auto& pool : pools_) held += pool->blocks().HeldBy(lease);
  return held;
}

size_t PoolSet::num_sequences() const {
  size_t n = 0;
  for (const auto& pool : pools_) {
    const SequenceTable& t = pool->sequences();
    n += t.size();
    if (pools_.size() > 1) {
      for (SeqId seq : t.Ids()) n -= t.Importing(seq) ? 1 : 0;
    }
  }
  return n;
}

void PoolSet::TrackChanges() {
  tracking_ = true;
  for (auto& pool : pools_) pool->TrackChanges();
  leases_.TrackChanges(&lease_changes_);
}

PoolSet::Changes PoolSet::TakeChanges() {
  Changes changes;
  changes.pools.reserve(pools_.size());
  for (auto& pool : pools_) changes.pools.push_back(pool->TakeChanges());
  changes.leases = std::exchange(lease_changes_, {});
  return changes;
}

absl::Status PoolSet::CheckInvariants() const {
  absl::flat_hash_set<SeqId> homes;
  for (PoolIndex i = 0; i < pools_.size(); ++i) {
    const SequenceTable& t = pools_[i]->sequences();
    RETURN_IF_ERROR(pools_[i]->CheckInvariants());
    for (SeqId seq : t.Ids()) {
      if (!t.Importing(seq) && !homes.insert(seq).second) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " has two homes (pool ", i,
                                                " and another)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp
