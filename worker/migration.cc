#include "worker/migration.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace kvp {

absl::StatusOr<MigrateWork> MigrateWorkFromWire(wire::MigrateJob::Reader job,
                                                const JobContext& ctx) {
  MigrateWork w;
  w.sequence = job.getSequence();
  w.source_pool = job.getSourcePool();
  w.source_channel = job.getSourceChannel().cStr();
  w.source_gpu = job.getSourceGpu();
  w.transport = job.getTransport();
  if (w.transport != wire::Transport::HOST && w.transport != wire::Transport::PEER_COPY) {
    return absl::UnimplementedError(absl::StrCat(
        "migrate job with transport ", static_cast<int>(w.transport),
        ": this worker pulls from a mapped source arena (host, peer copy) only"));
  }
  if (w.source_channel.empty()) {
    return absl::InvalidArgumentError("migrate job without the source pool's fd channel");
  }
  if (job.getMoves().size() == 0) return absl::InvalidArgumentError("migrate job with no blocks");
  absl::flat_hash_set<int32_t> targets;
  for (auto m : job.getMoves()) {
    for (int32_t b : {m.getSource(), m.getTarget()}) {
      if (b < 0 || b >= ctx.num_blocks) {
        return absl::OutOfRangeError(
            absl::StrCat("migrate job names block ", b, "; the pools have ", ctx.num_blocks));
      }
    }
    if (!targets.insert(m.getTarget()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("migrate job writes block ", m.getTarget(), " twice"));
    }
    w.moves.emplace_back(m.getSource(), m.getTarget());
  }
  return w;
}

std::vector<BlockRun> CoalesceRuns(const std::vector<BlockCopyPair>& moves) {
  std::vector<BlockRun> runs;
  for (const auto& [source, target] : moves) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (last.source + last.count == source && last.target + last.count == target) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({.source = source, .target = target, .count = 1});
  }
  return runs;
}

}  // namespace kvp
