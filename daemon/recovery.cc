#include "daemon/recovery.h"

#include <spdlog/spdlog.h>

#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kvp {

absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> AdoptArenas(const StateHeader& header,
                                                                      const PoolsAsked& asked,
                                                                      FdStore& store) {
  if (!(header.spec == asked.spec) || header.block_stride != asked.block_stride) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pool spec changed: the log has ", header.spec.DebugString(), ", the flags ask for ",
        asked.spec.DebugString()));
  }
  std::vector<int32_t> logged_gpus;
  for (const PoolIdentity& p : header.pools) logged_gpus.push_back(p.gpu);
  if (logged_gpus != asked.gpus) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pools changed: the log has pools on GPUs [", absl::StrJoin(logged_gpus, ","),
                     "] (-1: host), the flags ask for [", absl::StrJoin(asked.gpus, ","), "]"));
  }
  if (header.arena_bytes != asked.arena_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("the arena size changed: the log has ",
                                                      header.arena_bytes >> 20, " MiB, the flags ask for ",
                                                      asked.arena_bytes >> 20, " MiB"));
  }
  std::vector<std::unique_ptr<ServedArena>> arenas;
  for (size_t i = 0; i < header.pools.size(); ++i) {
    const PoolIdentity& p = header.pools[i];
    if (p.chunk_bytes.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("pool ", i, " has no chunks in the log"));
    }
    std::vector<UniqueFd> fds;
    for (size_t c = 0; c < p.chunk_bytes.size(); ++c) {
      if (p.chunk_bytes[c] != p.chunk_bytes[0]) {
        return absl::FailedPreconditionError(
            absl::StrCat("pool ", i, "'s chunks differ in size in the log"));
      }
      std::optional<UniqueFd> fd = store.Take(ChunkFdName(p.id, c));
      if (!fd.has_value()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "chunk ", c, " of pool ", i, " (", ChunkFdName(p.id, c),
            ") was not passed at start: no fd store (kvpoold runs outside systemd, or the unit "
            "lacks FileDescriptorStoreMax=), or the service was stopped rather than restarted"));
      }
      fds.push_back(*std::move(fd));
    }
    absl::StatusOr<std::unique_ptr<ServedArena>> arena =
        AdoptServedArena(p.gpu, p.chunk_bytes[0], std::move(fds));
    if (!arena.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", i, "'s chunks cannot be adopted: ", arena.status().message()));
    }
    if ((*arena)->chunk_sizes() != p.chunk_bytes) {
      return absl::FailedPreconditionError(absl::StrCat("pool ", i, "'s chunks are not the logged ones"));
    }
    arenas.push_back(*std::move(arena));
  }
  return arenas;
}

std::vector<PoolIdentity> NewPoolIdentities(
    const std::vector<std::unique_ptr<ServedArena>>& arenas, int32_t num_blocks) {
  std::random_device entropy;
  std::vector<PoolIdentity> ids;
  for (const auto& arena : arenas) {
    const uint64_t id = (uint64_t{entropy()} << 32) | entropy();
    ids.push_back({.id = id,
                   .gpu = arena->device(),
                   .chunk_bytes = arena->chunk_sizes(),
                   .num_blocks = num_blocks});
  }
  return ids;
}

absl::Status StoreArenas(const std::vector<std::unique_ptr<ServedArena>>& arenas,
                         const std::vector<PoolIdentity>& ids, FdStore& store) {
  for (size_t i = 0; i < arenas.size(); ++i) {
    ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, arenas[i]->ChunkFds());
    for (size_t c = 0; c < fds.size(); ++c) {
      RETURN_IF_ERROR(store.Store(ChunkFdName(ids[i].id, c), fds[c].get()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RestoredPools> RestorePools(RecoveredState state, PoolSet& pools,
                                           int64_t grace_micros, int64_t quarantine_micros) {
  if (state.pools.size() != pools.size()) {
    return absl::DataLossError(
        absl::StrCat("the log has ", state.pools.size(), " pools; kvpoold has ", pools.size()));
  }
  LeaseTable& leases = pools.leases();
  leases.SkipTo(state.next_lease);
  RestoredPools restored;
  for (const LeaseTable::WorkerLease& w : state.workers) restored.old_workers.push_back(w.id);
  bool reserved = false;
  for (const PoolImage& image : state.pools) reserved = reserved || !image.reserved.empty();
  if (reserved) {
    restored.quarantine = leases.Grant("restart quarantine", quarantine_micros);
    for (const LeaseTable::WorkerLease& w : state.workers) restored.pids.push_back(w.pid);
  }
  absl::Status status;
  for (PoolIndex i = 0; i < pools.size() && status.ok(); ++i) {
    for (const auto& [seq, c] : state.pools[i].sequences) {
      if (pools.Home(seq).has_value()) {
        status = absl::DataLossError(absl::StrCat("sequence ", seq, " lives in two pools"));
      }
    }
    if (status.ok()) status = pools.pool(i).Restore(std::move(state.pools[i]), restored.quarantine);
  }
  if (!status.ok()) {
    for (PoolIndex i = 0; i < pools.size(); ++i) pools.pool(i).Restore(PoolImage(), 0).IgnoreError();
    if (restored.quarantine != 0) leases.Revoke(restored.quarantine);
    return status;
  }
  absl::flat_hash_set<LeaseId> owners;
  for (const LeaseTable::ClientLease& lease : state.leases) {
    leases.Restore(lease, grace_micros);
    owners.insert(lease.id);
  }
  // A sequence whose lease the log lost (it should not happen) goes when the grace ends.
  for (PoolIndex i = 0; i < pools.size(); ++i) {
    for (SeqId seq : pools.pool(i).sequences().Ids()) {
      const LeaseId owner = *pools.pool(i).sequences().Owner(seq);
      if (owners.insert(owner).second) {
        spdlog::warn("sequence {}'s lease {} is not in the state log; it ends in {} ms", seq,
                     owner, grace_micros / 1000);
        leases.Restore({.id = owner, .client = "", .expiry_micros = grace_micros}, grace_micros);
      }
    }
  }
  for (PoolIndex i = 0; i < pools.size(); ++i) {
    restored.sequences += pools.pool(i).sequences().size();
    const PoolCounts c = pools.pool(i).blocks().counts();
    restored.blocks += static_cast<uint64_t>(c.used + c.cached);
  }
  return restored;
}

}  // namespace kvp
