// kvpoold's state log (docs/design.md §10): what lets a restarted kvpoold keep the cache.
//
// One file, <state_dir>/kvpoold.state, of checksummed records (record_file.h) in the schema of
// state.capnp: a Header (pool spec, each pool's id, GPU and chunk sizes, the content digest key),
// a Snapshot of the whole state when the file was written, then one Batch per step of kvpoold's
// loop that changed something. A Batch holds the final state of what changed (a sequence's table
// as committed, a block's place in the prefix index, a reservation, a lease), so replaying is
// applying them in order; a torn last record is dropped. kvpoold flushes a batch after each
// message it handles and before it sends the replies: a change a client was told about is in the
// log. The file is written anew when kvpoold starts without a state to recover, continued after
// a recovery, and rewritten as one snapshot when it grows large.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "daemon/state/record_file.h"
#include "kvpool/layout/pool_spec.h"
#include "kvpool/pool/pool_set.h"
#include "protocol/content_digest.h"

namespace kvp {

// A pool as created: what the chunks a restarted kvpoold gets back must be.
struct PoolIdentity {
  uint64_t id = 0;  // random; names the pool's chunks in systemd's fd store
  int32_t gpu = -1;
  std::vector<uint64_t> chunk_bytes;
  int32_t num_blocks = 0;
  friend bool operator==(const PoolIdentity&, const PoolIdentity&) = default;
};

struct StateHeader {
  PoolSpec spec;
  int64_t block_stride = 0;
  std::vector<PoolIdentity> pools;
  ContentDigester::Key digest_key{};
  uint64_t arena_bytes = 0;  // per pool, as asked for
};

// The state a log describes.
struct RecoveredState {
  StateHeader header;
  std::vector<PoolImage> pools;  // one per header pool
  std::vector<LeaseTable::ClientLease> leases;
  std::vector<LeaseTable::WorkerLease> workers;  // registered when the log ended
  LeaseId next_lease = 1;
  uint64_t batches = 0;     // replayed after the snapshot
  uint64_t torn_bytes = 0;  // dropped at the end (a record torn by the crash)
  uint64_t valid_bytes = 0;  // what StateLog::Resume appends after
};

inline constexpr const char* kStateFileName = "kvpoold.state";

// Reads <dir>/kvpoold.state. NOT_FOUND when there is none; DATA_LOSS when it cannot be used
// (another state version, no header or snapshot, records that contradict the header).
absl::StatusOr<RecoveredState> ReadStateLog(const std::string& dir);

class StateLog {
 public:
  // Writes <dir>/kvpoold.state anew: `header` and a snapshot of `pools`, then starts recording
  // their changes (PoolSet::TrackChanges). REQUIRES: pools outlives the log.
  static absl::StatusOr<std::unique_ptr<StateLog>> Start(const std::string& dir,
                                                         StateHeader header, PoolSet* pools);

  // Appends to the log ReadStateLog read (after its `valid_bytes`, the torn tail dropped) for
  // `pools`, restored from it: a restart need not rewrite the whole state before serving. The
  // leases of `ended` (the last run's workers) are logged as ended.
  static absl::StatusOr<std::unique_ptr<StateLog>> Resume(const std::string& dir,
                                                          StateHeader header, PoolSet* pools,
                                                          uint64_t valid_bytes,
                                                          const std::vector<LeaseId>& ended);

  // Appends what changed since the last flush as one record (none when nothing did). An error
  // means the log no longer describes the pools: kvpoold must not reply, and stops.
  absl::Status Flush();

  // Rewrites the file as one snapshot when it has grown past max(256 MiB, 8 × the last
  // snapshot), so that replay stays short. Call between flushes. It takes as long as writing the
  // whole state (0.7 s for 100,000 sequences here), and kvpoold's loop waits meanwhile.
  absl::Status CompactIfLarge();
  absl::Status Compact();

  uint64_t file_bytes() const { return writer_.bytes(); }
  uint64_t flushes() const { return flushes_; }

 private:
  StateLog(std::string path, StateHeader header, PoolSet* pools)
      : path_(std::move(path)),
        header_(std::move(header)),
        pools_(pools),
        block_size_(pools->layout().spec().block_size) {}

  std::string path_;
  StateHeader header_;
  PoolSet* pools_;
  int32_t block_size_;
  RecordWriter writer_;
  uint64_t snapshot_bytes_ = 0;
  LeaseId logged_next_lease_ = 0;
  uint64_t flushes_ = 0;
  // Per sequence logged since the last snapshot: its incarnation, blocks and tail as logged, so
  // that a decode step's record carries what is new (keptBlocks, keptTail), not the whole table.
  struct Logged {
    uint64_t incarnation = 0;
    size_t blocks = 0;
    int64_t full_blocks = 0;  // the tail below follows them
    size_t tail = 0;
  };
  Logged LoggedOf(const CommittedSequence& c) const {
    return {c.incarnation, c.image.blocks.size(), c.image.length / block_size_,
            c.image.tail.size()};
  }
  absl::flat_hash_map<std::pair<PoolIndex, SeqId>, Logged> logged_;
};

}  // namespace kvp
