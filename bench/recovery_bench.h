// kvpool-bench recovery: how long a restarted kvpoold takes to serve again (docs/design.md §10):
// reading and replaying the state log of many sequences, restoring the pools from it and writing
// the new snapshot, and (cuda) importing and mapping a whole arena's chunks from fds whose
// creator is gone, as a restart adopts them from systemd's fd store.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct RecoveryBenchOptions {
  int64_t sequences = 100'000;
  uint64_t arena_bytes = uint64_t{64} << 30;
  int batches = 2'000;    // decode-step batches logged after the snapshot
  bool cuda = false;      // also adopt a cuda arena of arena_bytes on GPU 0
};

struct RecoveryReport {
  std::string device;     // the GPU's name, or "host"
  std::string pool;       // the pool spec
  int64_t sequences = 0;
  int64_t committed_blocks = 0, pool_blocks = 0;
  uint64_t state_bytes = 0;
  int batches = 0;
  double read_ms = 0;     // reading and replaying the log
  double restore_ms = 0;  // rebuilding the pools (invariants checked)
  double resume_ms = 0;   // reopening the log to append to it
  double snapshot_ms = 0; // the later compaction into one snapshot (not before serving)
  double adopt_ms = 0;    // cuda: importing and mapping the chunks
  int chunks = 0;
  uint64_t arena_bytes = 0;
  double total_ms = 0;
};

absl::StatusOr<RecoveryReport> RunRecoveryBench(const RecoveryBenchOptions& options);
std::string RecoveryTable(const RecoveryReport& r);
std::string RecoveryJson(const RecoveryReport& r, const std::string& date);

}  // namespace kvp::bench
