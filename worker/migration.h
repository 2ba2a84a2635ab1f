// A migration's receiving side (docs/design.md §6): the worker of the destination pool maps the
// source pool's arena (fetched from that pool's fd channel, like its own) and copies the moved
// blocks into its own arena; kvpoold commits them once the worker reports. Decoded and checked
// here before anything is mapped or copied.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/kvpool.capnp.h"
#include "worker/job.h"

namespace kvp {

struct MigrateWork {
  uint64_t sequence = 0;
  uint32_t source_pool = 0;
  std::string source_channel;  // the source pool's fd channel
  int32_t source_gpu = -1;
  wire::Transport transport = wire::Transport::HOST;
  std::vector<BlockCopyPair> moves;  // (source block, target block)
};

// INVALID_ARGUMENT for no moves, a target named twice or an empty channel; OUT_OF_RANGE for a
// block outside the pool (kvpoold's pools have one size; the source's is checked again when it is
// mapped); UNIMPLEMENTED for a transport this worker does not pull with.
absl::StatusOr<MigrateWork> MigrateWorkFromWire(wire::MigrateJob::Reader job,
                                                const JobContext& ctx);

// Consecutive moves whose source and target blocks both follow on: one copy each.
struct BlockRun {
  int32_t source = 0;
  int32_t target = 0;
  int32_t count = 0;
  friend bool operator==(const BlockRun&, const BlockRun&) = default;
};
std::vector<BlockRun> CoalesceRuns(const std::vector<BlockCopyPair>& moves);

}  // namespace kvp
