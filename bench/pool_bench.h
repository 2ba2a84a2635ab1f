// kvpool-bench pool: block operations per second of the pool's bookkeeping on one core.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct PoolBenchResult {
  double reserve_commit_per_s = 0;  // one block reserved, committed, released
  double append_commit_per_s = 0;   // one 64-token block appended to a sequence and committed
  double prefix_hit_per_s = 0;      // a new sequence finding one block by prefix
};

// Always succeeds; a StatusOr like the other benchmarks'.
absl::StatusOr<PoolBenchResult> RunPoolBench();
std::string PoolTable(const PoolBenchResult& r);
std::string PoolJson(const PoolBenchResult& r, const std::string& date, const std::string& host);

}  // namespace kvp::bench
