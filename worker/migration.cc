#include "worker/migration.h"

#include "absl/container/flat_hash_set.h"
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "protocol/transport_names.h"

namespace kvp {
namespace {

absl::StatusOr<LinkWork> LinkWorkFromWire(wire::TransferLink::Reader link) {
  LinkWork w;
  w.side = link.getSide();
  if (w.side != wire::TransferSide::RECEIVE && w.side != wire::TransferSide::SEND) {
    return absl::InvalidArgumentError("migrate job with an unknown link side");
  }
  w.id = link.getId();
  w.fresh = link.getFresh();
  const auto rendezvous = link.getRendezvous();
  w.rendezvous.assign(rendezvous.begin(), rendezvous.end());
  const auto token = link.getToken();
  w.token.assign(token.begin(), token.end());
  if (link.getDeadlineMillis() == 0) {
    return absl::InvalidArgumentError("migrate job whose link has no deadline");
  }
  w.deadline = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(link.getDeadlineMillis());
  w.source_chunk_bytes = link.getSourceChunkBytes();
  w.target_chunk_bytes = link.getTargetChunkBytes();
  if (w.source_chunk_bytes == 0 || w.target_chunk_bytes == 0) {
    return absl::InvalidArgumentError("migrate job whose link has no chunk sizes");
  }
  if (w.side == wire::TransferSide::SEND && w.fresh && w.rendezvous.empty()) {
    return absl::InvalidArgumentError("send side of a fresh link without its rendezvous");
  }
  return w;
}

}  // namespace

absl::StatusOr<MigrateWork> MigrateWorkFromWire(wire::MigrateJob::Reader job,
                                                const JobContext& ctx) {
  MigrateWork w;
  w.sequence = job.getSequence();
  w.source_pool = job.getSourcePool();
  w.source_channel = job.getSourceChannel().cStr();
  w.source_gpu = job.getSourceGpu();
  w.transport = job.getTransport();
  if (IsPaired(w.transport)) {
    if (!job.hasLink()) return absl::InvalidArgumentError("paired migrate job without its link");
    ASSIGN_OR_RETURN(w.link, LinkWorkFromWire(job.getLink()));
  } else if (w.transport != wire::Transport::HOST && w.transport != wire::Transport::PEER_COPY) {
    return absl::InvalidArgumentError(absl::StrCat("migrate job with transport ",
                                                   static_cast<int>(w.transport)));
  } else if (w.source_channel.empty()) {
    return absl::InvalidArgumentError("migrate job without the source pool's fd channel");
  }
  if (job.getMoves().size() == 0) return absl::InvalidArgumentError("migrate job with no blocks");
  // Each side checks the blocks of its own arena; a paired move's other side may be a pool of
  // another size (another node's, docs/design.md §11).
  const bool reads_source = !w.link.has_value() || w.link->side == wire::TransferSide::SEND;
  const bool writes_target = !w.link.has_value() || w.link->side == wire::TransferSide::RECEIVE;
  absl::flat_hash_set<int32_t> targets;
  for (auto m : job.getMoves()) {
    for (const auto& [b, here] : {std::pair{m.getSource(), reads_source},
                                 std::pair{m.getTarget(), writes_target}}) {
      if (b < 0 || (here && b >= ctx.num_blocks)) {
        return absl::OutOfRangeError(
            absl::StrCat("migrate job names block ", b, "; the pool has ", ctx.num_blocks));
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

std::vector<MovePiece> PiecesOf(const std::vector<BlockCopyPair>& moves, int64_t block_stride,
                                uint64_t source_chunk_bytes, uint64_t target_chunk_bytes) {
  const uint64_t stride = static_cast<uint64_t>(block_stride);
  std::vector<MovePiece> pieces;
  for (const BlockRun& run : CoalesceRuns(moves)) {
    uint64_t source = static_cast<uint64_t>(run.source) * stride;
    uint64_t target = static_cast<uint64_t>(run.target) * stride;
    uint64_t left = static_cast<uint64_t>(run.count) * stride;
    while (left > 0) {
      const uint64_t bytes =
          std::min({left, source_chunk_bytes - source % source_chunk_bytes,
                    target_chunk_bytes - target % target_chunk_bytes});
      pieces.push_back({.source_offset = source, .target_offset = target, .bytes = bytes});
      source += bytes;
      target += bytes;
      left -= bytes;
    }
  }
  return pieces;
}

}  // namespace kvp
