#include "daemon/recovery.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kvp {

absl::Status CheckLoggedPools(const StateHeader& header, const PoolsAsked& asked) {
  if (!(header.spec == asked.spec) || header.block_stride != asked.block_stride) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pool spec changed: the log has ", header.spec.DebugString(), ", the flags ask for ",
        asked.spec.DebugString()));
  }
  std::vector<int32_t> logged_gpus;
  for (const PoolIdentity& p : header.pools) logged_gpus.push_back(p.gpu);
  if (logged_gpus != asked.gpus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pools changed: the log has pools on GPUs [", absl::StrJoin(logged_gpus, ","),
        "] (-1: host), the flags ask for [", absl::StrJoin(asked.gpus, ","), "]"));
  }
  if (header.arena_bytes != asked.arena_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the arena size changed: the log has ", header.arena_bytes >> 20,
                     " MiB, the flags ask for ", asked.arena_bytes >> 20, " MiB"));
  }
  for (size_t i = 0; i < header.pools.size(); ++i) {
    const std::vector<uint64_t>& chunks = header.pools[i].chunk_bytes;
    if (chunks.empty() || std::any_of(chunks.begin(), chunks.end(),
                                      [&](uint64_t c) { return c != chunks[0]; })) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", i, "'s chunks in the log are none or of different sizes"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::optional<std::vector<UniqueFd>>> TakeStoredChunks(const StateHeader& header,
                                                                   FdStore& store) {
  std::vector<std::optional<std::vector<UniqueFd>>> out(header.pools.size());
  for (size_t i = 0; i < header.pools.size(); ++i) {
    const PoolIdentity& p = header.pools[i];
    std::vector<UniqueFd> fds;
    for (size_t c = 0; c < p.chunk_bytes.size(); ++c) {
      std::optional<UniqueFd> fd = store.Take(ChunkFdName(p.id, c));
      if (!fd.has_value()) break;
      fds.push_back(*std::move(fd));
    }
    if (fds.size() == p.chunk_bytes.size()) out[i] = std::move(fds);
  }
  return out;
}

namespace {

// Why a handed-back arena is not the missing pool `p` it names; empty when it is.
std::string NotThePool(const ArenaDescription& d, const PoolIdentity& p, size_t fds) {
  if (d.chunk_bytes != p.chunk_bytes || fds != p.chunk_bytes.size()) {
    return "its chunks are not the logged ones";
  }
  if ((d.kind == ArenaKind::kCuda) != (p.gpu >= 0) || (p.gpu >= 0 && d.device != p.gpu)) {
    return "it is memory of another device";
  }
  return "";
}

}  // namespace

void AwaitHandBack(const StateHeader& header, const std::string& path, const AllowList& allow,
                   int timeout_ms, std::vector<std::optional<std::vector<UniqueFd>>>& chunks) {
  const auto missing = [&] {
    return std::count_if(chunks.begin(), chunks.end(), [](const auto& c) { return !c; });
  };
  if (missing() == 0) return;
  absl::StatusOr<FdChannelServer> server = FdChannelServer::Listen(path, allow);
  if (!server.ok()) {
    spdlog::warn("cannot ask workers for the arena: {}", server.status().ToString());
    return;
  }
  spdlog::info("waiting up to {} ms for workers to hand back the chunks of {} pool(s) on {}",
               timeout_ms, missing(), path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (missing() > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;
    absl::StatusOr<FdPeer> peer = server->Accept(static_cast<int>(left));
    if (!peer.ok()) continue;  // a timeout ends the loop above; a refused peer was told why
    auto arena = peer->ReceiveArena(2000);
    if (!arena.ok()) continue;
    auto& [description, fds] = *arena;
    std::string why = "it names no pool of the log that is still missing";
    for (size_t i = 0; i < header.pools.size(); ++i) {
      if (chunks[i].has_value() || description.arena_id != header.pools[i].id) continue;
      why = NotThePool(description, header.pools[i], fds.size());
      if (why.empty()) {
        spdlog::info("pool {}'s chunks handed back by pid {}", i, peer->credentials().pid);
        chunks[i] = std::move(fds);
      }
      break;
    }
    (void)peer->Send(why.empty() ? "ok" : why);
  }
}

absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> AdoptArenas(
    const StateHeader& header, std::vector<std::optional<std::vector<UniqueFd>>> chunks) {
  std::vector<std::unique_ptr<ServedArena>> arenas;
  for (size_t i = 0; i < header.pools.size(); ++i) {
    const PoolIdentity& p = header.pools[i];
    if (!chunks[i].has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the chunks of pool ", i, " (", ChunkFdName(p.id, 0),
          " ...) were neither passed at start nor handed back by a worker: no fd store (kvpoold "
          "runs outside systemd, or the unit lacks FileDescriptorStoreMax=), the service was "
          "stopped rather than restarted, and no worker holds the arena"));
    }
    absl::StatusOr<std::unique_ptr<ServedArena>> arena =
        AdoptServedArena(p.gpu, p.chunk_bytes[0], *std::move(chunks[i]));
    if (!arena.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", i, "'s chunks cannot be adopted: ", arena.status().message()));
    }
    if ((*arena)->chunk_sizes() != p.chunk_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", i, "'s chunks are not the logged ones"));
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
                         const std::vector<PoolIdentity>& ids, FdStore& store,
                         const std::vector<size_t>& which) {
  for (size_t i = 0; i < arenas.size(); ++i) {
    if (!which.empty() && std::find(which.begin(), which.end(), i) == which.end()) continue;
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
  bool reserved = false;
  for (const PoolImage& image : state.pools) reserved = reserved || !image.reserved.empty();
  if (reserved) {
    // The last run's workers stay in the log while their jobs may write: should kvpoold die
    // again before the quarantine ends, the next start waits for them too.
    restored.quarantine = leases.Grant("restart quarantine", quarantine_micros);
    for (const LeaseTable::WorkerLease& w : state.workers) restored.pids.push_back(w.pid);
  } else {
    for (const LeaseTable::WorkerLease& w : state.workers) restored.old_workers.push_back(w.id);
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
