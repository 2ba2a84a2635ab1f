#include "bench/recovery_bench.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "daemon/recovery.h"
#include "daemon/state/state_log.h"
#include "kvpool/pool/pool_set.h"
#if defined(KVP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kvpool/arena/cuda_arena.h"
#endif

namespace kvp::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The pool of deploy/kvpoold.flags: a DeepSeek-sized cache.
PoolSpec DeploySpec() {
  PoolSpec spec;
  spec.num_layers = 61;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.block_size = 64;
  spec.k_format = KvFormat::kFp8E4m3;
  spec.v_format = KvFormat::kTurbo3;
  spec.indexer = true;
  return spec;
}

// `n` sequences of 100 clients: prefills of 1 to 4 blocks while they fit, the rest forks of them
// (agents and beams share most of their context), as a busy kvpoold holds them.
absl::Status Fill(PoolSet& pools, int64_t n, std::mt19937_64& rng) {
  std::vector<LeaseId> clients;
  for (int c = 0; c < 100; ++c) {
    clients.push_back(pools.leases().GrantClient(absl::StrCat("client-", c), 30'000'000));
  }
  SequenceTable& t = pools.pool(0).sequences();
  const int32_t block = pools.layout().spec().block_size;
  std::vector<SeqId> seqs;
  int32_t next_token = 0;
  for (SeqId seq = 1; static_cast<int64_t>(seqs.size()) < n; ++seq) {
    const LeaseId lease = clients[rng() % clients.size()];
    if (seqs.empty() || rng() % 8 == 0) {
      std::vector<int32_t> tokens(static_cast<size_t>(block) * (1 + rng() % 4) - rng() % block);
      for (int32_t& x : tokens) x = next_token++;
      if (t.Append(seq, lease, tokens).ok()) {
        RETURN_IF_ERROR(t.Commit(seq));
        seqs.push_back(seq);
        continue;
      }
    }
    RETURN_IF_ERROR(t.Fork(seqs[rng() % seqs.size()], seq, lease));
    seqs.push_back(seq);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RecoveryReport> RunRecoveryBench(const RecoveryBenchOptions& options) {
  RecoveryReport r;
  r.device = "host";
  const PoolSpec spec = DeploySpec();
  r.pool = spec.DebugString();
  r.arena_bytes = options.arena_bytes;
  FakeClock clock;
  ASSIGN_OR_RETURN(std::unique_ptr<PoolSet> pools,
                   PoolSet::Create(spec, options.arena_bytes, 1, &clock, 3'000'000));
  std::mt19937_64 rng(7);
  RETURN_IF_ERROR(Fill(*pools, options.sequences, rng));
  r.pool_blocks = pools->pool(0).blocks().num_blocks();

  char dir_template[] = "/tmp/kvpool-recovery-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = dir_template;
  StateHeader header{.spec = spec,
                     .block_stride = pools->layout().block_stride(),
                     .pools = {{.id = 1, .gpu = -1, .chunk_bytes = {options.arena_bytes},
                                .num_blocks = static_cast<int32_t>(r.pool_blocks)}},
                     .digest_key = {},
                     .arena_bytes = options.arena_bytes};
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<StateLog> log, StateLog::Start(dir, header, pools.get()));
    // Decode steps of 64 sequences at a time, each one batch, as kvpoold logs them.
    SequenceTable& t = pools->pool(0).sequences();
    const std::vector<SeqId> ids = t.Ids();
    const LeaseId lease = *t.Owner(ids.front());
    for (int b = 0; b < options.batches; ++b) {
      for (int s = 0; s < 64; ++s) {
        const SeqId seq = ids[rng() % ids.size()];
        if (*t.Owner(seq) != lease) continue;
        const int32_t token = 5;
        if (t.Append(seq, lease, {&token, 1}).ok()) RETURN_IF_ERROR(t.Commit(seq));
      }
      RETURN_IF_ERROR(log->Flush());
    }
    r.state_bytes = log->file_bytes();
    r.batches = options.batches;

    // The restart: read and replay, rebuild, write the new snapshot.
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(RecoveredState state, ReadStateLog(dir));
    r.read_ms = MillisSince(t0);
    const uint64_t valid_bytes = state.valid_bytes;
    ASSIGN_OR_RETURN(std::unique_ptr<PoolSet> restored,
                     PoolSet::Create(spec, options.arena_bytes, 1, &clock, 3'000'000));
    const auto t1 = Clock::now();
    ASSIGN_OR_RETURN(RestoredPools done, RestorePools(std::move(state), *restored, 0, 0));
    r.restore_ms = MillisSince(t1);
    r.sequences = static_cast<int64_t>(done.sequences);
    r.committed_blocks = static_cast<int64_t>(done.blocks);
    const auto t2 = Clock::now();
    ASSIGN_OR_RETURN(std::unique_ptr<StateLog> again,
                     StateLog::Resume(dir, header, restored.get(), valid_bytes, done.old_workers));
    r.resume_ms = MillisSince(t2);
    // Not on the way to serving: the compaction the log does later, in kvpoold's loop.
    const auto t3 = Clock::now();
    RETURN_IF_ERROR(again->Compact());
    r.snapshot_ms = MillisSince(t3);
    return absl::OkStatus();
  }();
  std::filesystem::remove_all(dir);
  RETURN_IF_ERROR(status);

  if (options.cuda) {
#if defined(KVP_HAVE_CUDA)
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return absl::UnavailableError("no GPU");
    r.device = prop.name;
    ASSIGN_OR_RETURN(const uint64_t granularity, CudaArena::Granularity(0));
    const uint64_t chunk = (kDefaultCudaChunkBytes + granularity - 1) / granularity * granularity;
    std::vector<UniqueFd> fds;
    {
      // The last kvpoold's arena: only its exported fds outlive it, as in the fd store.
      ASSIGN_OR_RETURN(CudaArena old,
                       CudaArena::Create(0, chunk, options.arena_bytes, options.arena_bytes));
      ASSIGN_OR_RETURN(fds, old.ExportFds());
    }
    r.chunks = static_cast<int>(fds.size());
    const auto t3 = Clock::now();
    ASSIGN_OR_RETURN(CudaArena adopted, CudaArena::Adopt(0, chunk, std::move(fds)));
    r.adopt_ms = MillisSince(t3);
    if (adopted.mapped_bytes() < options.arena_bytes) return absl::InternalError("short arena");
#else
    return absl::UnimplementedError("a build without CUDA: no cuda arena to adopt");
#endif
  }
  r.total_ms = r.read_ms + r.restore_ms + r.resume_ms + r.adopt_ms;
  return r;
}

std::string RecoveryTable(const RecoveryReport& r) {
  return absl::StrFormat(
      "recovery on %s, pool %s\n"
      "  state: %d sequences, %d committed blocks of %d, %d batches after the snapshot, %.1f MB\n"
      "  read + replay %.1f ms, restore %.1f ms, log reopened %.1f ms, adopt %d chunks (%.0f GiB) "
      "%.1f ms\n  total %.1f ms (goal: 1000 ms from start to serving); the later compaction "
      "into one snapshot %.1f ms\n",
      r.device, r.pool, r.sequences, r.committed_blocks, r.pool_blocks, r.batches,
      r.state_bytes / 1e6, r.read_ms, r.restore_ms, r.resume_ms, r.chunks,
      r.arena_bytes / double(1ull << 30), r.adopt_ms, r.total_ms, r.snapshot_ms);
}

std::string RecoveryJson(const RecoveryReport& r, const std::string& date) {
  return absl::StrFormat(
      "{\n  \"bench\": \"recovery\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n"
      "  \"pool\": \"%s\",\n  \"sequences\": %d,\n  \"committed_blocks\": %d,\n"
      "  \"pool_blocks\": %d,\n  \"batches\": %d,\n  \"state_bytes\": %d,\n"
      "  \"read_ms\": %.3f,\n  \"restore_ms\": %.3f,\n  \"resume_ms\": %.3f,\n"
      "  \"compaction_ms\": %.3f,\n"
      "  \"arena_bytes\": %d,\n  \"chunks\": %d,\n  \"adopt_ms\": %.3f,\n  \"total_ms\": %.3f\n}\n",
      date, r.device, r.pool, r.sequences, r.committed_blocks, r.pool_blocks, r.batches,
      r.state_bytes, r.read_ms, r.restore_ms, r.resume_ms, r.snapshot_ms, r.arena_bytes, r.chunks,
      r.adopt_ms, r.total_ms);
}

}  // namespace kvp::bench
