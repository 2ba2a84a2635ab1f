// LeaseTable: every attached process (worker, client, engine) holds a lease, renewed by its
// heartbeats; one that is not renewed within the expiry ends, and the pool takes back what it
// held (docs/design.md §7). Time comes from a Clock, so tests expire leases without sleeping.
// Not thread-safe: the daemon's loop owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/clock.h"

namespace kvp {

inline constexpr int64_t kDefaultLeaseExpiryMicros = 3'000'000;  // 3 s (heartbeats every 1 s)

class LeaseTable {
 public:
  // REQUIRES: clock outlives the table; expiry_micros > 0.
  LeaseTable(const Clock* clock, int64_t expiry_micros = kDefaultLeaseExpiryMicros);

  // A new lease for `holder` (a name for logs and metrics), alive until now + expiry; each renewal
  // extends it by the same expiry. The second form gives this lease its own expiry (clients that
  // do not heartbeat every second).
  LeaseId Grant(std::string holder);
  LeaseId Grant(std::string holder, int64_t expiry_micros);

  // A heartbeat: pushes the deadline to now + expiry. ABORTED when the lease is unknown or has
  // expired: the holder must re-register (docs/design.md §7).
  absl::Status Renew(LeaseId lease);

  bool Alive(LeaseId lease) const;
  const std::string* Holder(LeaseId lease) const;

  // Ends `lease` now (the holder said goodbye). False when it was not alive.
  bool Revoke(LeaseId lease);

  // Removes and returns every lease whose deadline has passed.
  std::vector<LeaseId> Expire();

  size_t size() const { return leases_.size(); }

 private:
  struct Lease {
    std::string holder;
    int64_t expiry_micros;
    int64_t deadline_micros;
  };
  const Clock* clock_;
  int64_t expiry_micros_;
  LeaseId next_ = 1;
  absl::flat_hash_map<LeaseId, Lease> leases_;
};

}  // namespace kvp
