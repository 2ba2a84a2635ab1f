// kvpool-bench migrate: how fast a migration's receiving worker copies blocks from another pool's
// cuda arena into its own, through the worker's own code (CudaExecutor::MoveBlocksFrom over two
// cuMem arenas exported and imported as kvpoold and the workers do), beside a plain cudaMemcpy of
// the same bytes in the same run (cudaMemcpyPeer when the pools are on two GPUs). On two GPUs also
// the nccl transport's path (worker/nccl_transport.h, a sender and a receiver thread as on two
// workers) beside one raw ncclSend/ncclRecv of 1 GiB. CUDA builds.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct MigrateCase {
  std::string name;       // e.g. "1 GiB contiguous"
  std::string path;       // "copy engine" (runs), "block move kernel", or the raw baseline
  int64_t blocks = 0;
  int64_t runs = 0;       // runs of consecutive blocks
  double bytes = 0;       // bytes moved (each read once and written once)
  double median_ms = 0;
  double gb_per_s = 0;    // bytes moved per second
  double of_raw = 0;      // gb_per_s over its raw baseline: cudaMemcpy(Peer), or ncclSend/Recv for nccl
};

struct MigrateReport {
  std::string device;
  int source_gpu = 0, target_gpu = 0;
  int64_t block_bytes = 0;
  std::vector<MigrateCase> cases;
};

absl::StatusOr<MigrateReport> RunMigrateBench(int source_gpu, int target_gpu);
std::string MigrateTable(const MigrateReport& r);
std::string MigrateJson(const MigrateReport& r, const std::string& date);

}  // namespace kvp::bench
