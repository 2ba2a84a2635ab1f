// A migration's work on a worker (docs/design.md §6), decoded and checked here before anything is
// mapped, copied or sent. Host and peer-copy moves are pulled by a worker of the destination pool
// alone: it maps the source pool's arena (fetched from that pool's fd channel, like its own) and
// copies the moved blocks into its own arena. NCCL and socket moves are paired: a sender of the
// source pool and a receiver of the destination pool, joined by a link (worker/paired_move.h);
// both cut the moves into the same pieces, so that every send has a receive of the same size.
// kvpoold commits once the receiving worker reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/kvpool.capnp.h"
#include "worker/job.h"

namespace kvp {

// The link of a paired move (nccl, socket: worker/paired_move.h), as kvpoold set it up.
struct LinkWork {
  wire::TransferSide side = wire::TransferSide::RECEIVE;
  uint64_t id = 0;
  bool fresh = true;
  std::string rendezvous;  // send side of a fresh link
  std::string token;       // socket links
  std::chrono::steady_clock::time_point deadline;
  uint64_t source_chunk_bytes = 0;
  uint64_t target_chunk_bytes = 0;
};

// One range moved as one send and one receive: the bytes at source_offset of the source arena land
// at target_offset of the target arena.
struct MovePiece {
  uint64_t source_offset = 0;
  uint64_t target_offset = 0;
  uint64_t bytes = 0;
  friend bool operator==(const MovePiece&, const MovePiece&) = default;
};

struct MigrateWork {
  uint64_t sequence = 0;
  uint32_t source_pool = 0;
  std::string source_channel;  // the source pool's fd channel
  int32_t source_gpu = -1;
  wire::Transport transport = wire::Transport::HOST;
  std::vector<BlockCopyPair> moves;  // (source block, target block)
  std::optional<LinkWork> link;      // paired transports only
};

// INVALID_ARGUMENT for no moves, a target named twice, an empty channel (pulled moves) or a bad
// link (paired moves: none, no deadline, chunk sizes of 0); OUT_OF_RANGE for a block outside the
// pool (kvpoold's pools have one size; the source's is checked again when it is mapped).
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

// The moves' runs, cut where either side's arena has a chunk boundary (NCCL has known problems
// with ranges over several cuMem allocations: NVIDIA/nccl issues 1820, 2332), in move order.
// REQUIRES: block_stride > 0; chunk sizes > 0.
std::vector<MovePiece> PiecesOf(const std::vector<BlockCopyPair>& moves, int64_t block_stride,
                                uint64_t source_chunk_bytes, uint64_t target_chunk_bytes);

}  // namespace kvp
