// LeaseTable: every attached process (worker, client, engine) holds a lease, renewed by its
// heartbeats; one that is not renewed within the expiry ends, and the pool takes back what it
// held (docs/design.md §7). Time comes from a Clock, so tests expire leases without sleeping.
// Not thread-safe: the daemon's loop owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
  // A client's lease, named by its routing id: the leases that own sequences, and the ones
  // kvpoold's state log keeps across restarts.
  LeaseId GrantClient(const std::string& client, int64_t expiry_micros);
  // A worker process's lease: the state log keeps its pid, so that a restarted kvpoold knows
  // whose jobs may still be writing blocks.
  LeaseId GrantWorker(std::string holder, uint32_t pid);

  // A heartbeat: pushes the deadline to now + expiry. ABORTED when the lease is unknown or has
  // expired: the holder must re-register (docs/design.md §7).
  absl::Status Renew(LeaseId lease);

  bool Alive(LeaseId lease) const;
  const std::string* Holder(LeaseId lease) const;
  // The client a lease of GrantClient belongs to; null for other leases and unknown ones.
  const std::string* Client(LeaseId lease) const;

  // Ends `lease` now (the holder said goodbye). False when it was not alive.
  bool Revoke(LeaseId lease);

  // Removes and returns every lease whose deadline has passed.
  std::vector<LeaseId> Expire();

  size_t size() const { return leases_.size(); }

  // ---- Persistence (kvpoold's state log, docs/design.md §10) ----
  struct ClientLease {
    LeaseId id = 0;
    std::string client;
    int64_t expiry_micros = 0;
  };
  struct WorkerLease {
    LeaseId id = 0;
    uint32_t pid = 0;
  };
  // From now on every client or worker lease granted or ended is added to `changed` (null: stop).
  void TrackChanges(absl::flat_hash_set<LeaseId>* changed) { changes_ = changed; }
  // The id the next Grant returns; ids are never reused, also across restarts.
  LeaseId next_id() const { return next_; }
  void SkipTo(LeaseId next_id) { next_ = std::max(next_, next_id); }
  // A client lease from before a restart, alive for `grace_micros` from now (or its own expiry,
  // if longer) so that its client can come back before its sequences are reaped.
  void Restore(const ClientLease& lease, int64_t grace_micros);
  // The live client leases, by id.
  std::vector<ClientLease> ClientLeases() const;
  std::optional<ClientLease> FindClientLease(LeaseId lease) const;
  std::vector<WorkerLease> WorkerLeases() const;
  std::optional<WorkerLease> FindWorkerLease(LeaseId lease) const;

 private:
  struct Lease {
    std::string holder;
    int64_t expiry_micros;
    int64_t deadline_micros;
    std::string client;  // GrantClient's
    uint32_t pid = 0;    // GrantWorker's
  };
  void Changed(LeaseId lease, const Lease& l) {
    if (changes_ != nullptr && (!l.client.empty() || l.pid != 0)) changes_->insert(lease);
  }
  const Clock* clock_;
  int64_t expiry_micros_;
  LeaseId next_ = 1;
  absl::flat_hash_map<LeaseId, Lease> leases_;
  absl::flat_hash_set<LeaseId>* changes_ = nullptr;
};

}  // namespace kvp
