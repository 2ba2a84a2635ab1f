// Every pool a capability table says a worker serves, and one prefill and one decode step run on
// it through an executor: what a worker advertises when it registers must run.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "kvpool/format/op_capabilities.h"
#include "worker/executor.h"
#include "worker/job.h"

namespace kvp::testing {

inline constexpr int kServedPoolBlocks = 8;

// One small pool (2 layers, 2 kv heads, blocks of 16, 4 q heads, top-16) for every K format, V
// format and head dim of `served`, with and without an indexer.
std::vector<JobContext> PoolsServedBy(const OpCapabilities& served);

// Prefills 20 synthetic tokens of one sequence into blocks 0 and 1, then decodes one step; the
// first error, or INTERNAL when an output is missing or not finite.
absl::Status PrefillAndDecode(Executor& executor, const JobContext& ctx);

}  // namespace kvp::testing
