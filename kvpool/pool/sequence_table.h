// SequenceTable: the block table of every sequence, built on the BlockAllocator.
//
// A sequence is a list of blocks holding its tokens in order; position p sits in slot
// blocks[p / block_size] · block_size + p % block_size. Appends are two-phase like the blocks
// under them: Append plans the write (slots, new reservations, copies), then Commit or Abort.
// Sharing:
//   - prefix hits: a new sequence reuses committed blocks whose prefix hash chain matches its
//     leading full blocks, and only the rest is written;
//   - Fork: a sequence shares all of another's committed blocks; full blocks are never written
//     again, and the partial last block is copied on the first append into it while shared.
// Every sequence belongs to one lease; its references are that lease's. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/prefix_hash.h"

namespace kvp {

using SeqId = uint64_t;

// How a new sequence's full blocks may be shared as prefix hits (prefix_hash.h).
struct SharingScope {
  uint64_t root = kRootPrefixHash;  // its namespace's chain root
  bool shared = true;               // false: its blocks are never found by another sequence
  friend bool operator==(const SharingScope&, const SharingScope&) = default;
};

struct AppendPlan {
  int32_t prefix_hit_tokens = 0;  // leading tokens already in committed blocks: not to be written
  std::vector<int64_t> slots;     // slot of every appended token after the hits
  std::vector<BlockId> reserved;  // new blocks of this append
  // Copy-on-write: copy block `first` onto `second` before writing (the shared partial block).
  std::vector<std::pair<BlockId, BlockId>> copies;
};

// A committed sequence apart from its pool: what rebuilding it in another pool of the same spec
// needs (a migration, docs/design.md §6).
struct SequenceImage {
  SharingScope scope;
  int64_t length = 0;
  uint64_t full_hash = 0;                 // chain hash of the last full block
  std::vector<int32_t> tail;              // tokens of the partial last block
  std::vector<TokenDigest> tail_digests;  // and their digests
  std::vector<BlockId> blocks;            // in the source pool
  // Per block: the key it is indexed under in the source pool, if any; the destination indexes
  // it the same way, and takes a block it already holds under that key instead of a copy.
  std::vector<std::optional<PrefixKey>> keys;
};

// A sequence as it was last committed, with its owner: what kvpoold's state log keeps of it
// (docs/design.md §10). `image.keys` is empty: the log keeps the prefix index apart.
struct CommittedSequence {
  LeaseId owner = 0;
  SequenceImage image;
  // Which life of its id this is: a new one for every sequence created (appended to when new,
  // forked, imported, restored). Within one life a table only grows, apart from its last block
  // (a copy-on-write), so a log may send just the blocks after those it sent before.
  uint64_t incarnation = 0;
};

// The block copies an import needs: image.blocks[i] of the source pool onto `target`.
struct BlockMove {
  BlockId source = 0;
  BlockId target = 0;
  friend bool operator==(const BlockMove&, const BlockMove&) = default;
};

class SequenceTable {
 public:
  // REQUIRES: allocator outlives the table; block_size > 0.
  SequenceTable(BlockAllocator* allocator, int32_t block_size);

  // Plans appending `tokens` to `seq` (created, owned by `lease`, when new), with one content
  // digest per token (empty: all kSyntheticTokenDigest). `scope` is a new sequence's; for an
  // existing one it must be the sequence's own (nullopt: whatever it is, or the default for a new
  // one). FAILED_PRECONDITION while an earlier append is pending, when `lease` does not own
  // `seq` or for another scope; INVALID_ARGUMENT for a digest count other than the token count;
  // RESOURCE_EXHAUSTED when the pool cannot hold it (nothing changes then).
  absl::StatusOr<AppendPlan> Append(SeqId seq, LeaseId lease, absl::Span<const int32_t> tokens,
                                    absl::Span<const TokenDigest> digests = {},
                                    const std::optional<SharingScope>& scope = std::nullopt);

  // Makes the pending append readable (and its full blocks findable by prefix).
  absl::Status Commit(SeqId seq);

  // Undoes the pending append: reservations return, the sequence is as before.
  absl::Status Abort(SeqId seq);

  // `dst`, owned by `lease`, shares every committed block of `src`. FAILED_PRECONDITION while
  // `src` has a pending append; ALREADY_EXISTS for an existing `dst`.
  absl::Status Fork(SeqId src, SeqId dst, LeaseId lease);

  // The committed state of `seq`, for Import elsewhere. FAILED_PRECONDITION while it has a
  // pending append (or is being imported).
  absl::StatusOr<SequenceImage> Image(SeqId seq) const;

  // Plans rebuilding `image` here as `seq`, owned by `lease`: blocks this pool holds under the
  // image's keys are referenced, blocks `lease` staged for it are taken (those not needed are
  // given back), a block is reserved for each other one. Commit makes it
  // readable as the image says; Abort drops it. Until then it is pending, like an append.
  // ALREADY_EXISTS when `seq` is here; RESOURCE_EXHAUSTED (nothing changes) when it does not fit.
  // `staged_taken`, if set, is how many staged blocks were taken.
  absl::StatusOr<std::vector<BlockMove>> Import(SeqId seq, LeaseId lease, SequenceImage image,
                                                size_t* staged_taken = nullptr);

  // True while `seq` is an Import that is neither committed nor aborted.
  bool Importing(SeqId seq) const;

  // ---- Staging: blocks copied here before their sequence is imported (a sliced prefill
  // streamed to its decode pool, docs/design.md §6) ----
  // Reserves for `lease` a block here for each of `sources` (blocks of `seq` in its home pool that
  // are full and never written again) not staged already: the caller copies them there, and
  // Import of `seq` by `lease` takes the staged copies instead of reserving and copying again.
  // FAILED_PRECONDITION when `seq` is here or staged by another lease; RESOURCE_EXHAUSTED (nothing
  // changes) when they do not fit.
  absl::StatusOr<std::vector<BlockMove>> Stage(SeqId seq, LeaseId lease,
                                               absl::Span<const BlockId> sources);
  // Gives back the staged blocks of `moves` (a copy that failed), or every one of `seq`.
  void Unstage(SeqId seq, absl::Span<const BlockMove> moves);
  void DropStaged(SeqId seq);
  size_t StagedBlocks(SeqId seq) const;

  // Drops the sequence (a pending append is aborted) and its references.
  absl::Status Release(SeqId seq);

  // Forgets every sequence (and staged block) of `lease` without touching the allocator: call
  // before BlockAllocator::ReleaseLease, which returns their blocks. Returns how many sequences
  // were dropped.
  int64_t ForgetLease(LeaseId lease);

  // NOT_FOUND for an unknown sequence.
  absl::StatusOr<int64_t> Length(SeqId seq) const;  // committed tokens
  // A pending append's blocks included; valid until the sequence next changes.
  absl::StatusOr<absl::Span<const BlockId>> Blocks(SeqId seq) const;
  absl::StatusOr<LeaseId> Owner(SeqId seq) const;
  // True while an append is planned but neither committed nor aborted.
  absl::StatusOr<bool> HasPending(SeqId seq) const;
  bool Contains(SeqId seq) const { return seqs_.contains(seq); }
  // Every sequence here, imports in flight included; in no particular order.
  std::vector<SeqId> Ids() const;

  // ---- Persistence (kvpoold's state log, docs/design.md §10) ----
  // From now on every sequence whose committed state changes (commit, fork, release, a lease's
  // end) is added to `changed` (null: stop). REQUIRES: `changed` outlives the table or the next call.
  void TrackChanges(absl::flat_hash_set<SeqId>* changed) { changes_ = changed; }
  // `seq` as last committed, pending appends not included; nullopt when nothing of it is
  // committed (unknown, an import in flight, a first append not committed yet).
  std::optional<CommittedSequence> Committed(SeqId seq) const;
  // Adds a committed sequence without touching the allocator (BlockAllocator::Restore holds its
  // references). DATA_LOSS when its blocks, tail and length disagree or it exists already.
  absl::Status Restore(SeqId seq, CommittedSequence committed);

  // OK when the allocator's holdings are exactly what the tables say: each lease reserves its
  // pending appends' new blocks and its staged blocks and references its sequences' other blocks
  // (once per sequence), plus the block a pending copy-on-write replaced. O(blocks). For tests
  // and fuzzers.
  // `outside` adds what leases hold apart from any table (a restart's quarantine, pool.h).
  absl::Status CheckAgainst(const BlockAllocator& allocator,
                            const absl::flat_hash_map<LeaseId, LeaseHoldings>& outside = {}) const;
  size_t size() const { return seqs_.size(); }

 private:
  // What Abort needs to undo an append in place: a decode step's append must not copy a table
  // of hundreds of blocks.
  struct Pending {
    int64_t old_length = 0;
    size_t old_block_count = 0;  // the blocks appended come after; a copy replaced the last
    std::vector<int32_t> tokens;  // appended, hits included
    std::vector<TokenDigest> digests;  // one per token; empty: all synthetic
    AppendPlan plan;
    std::vector<BlockId> hit_blocks;  // blocks referenced by prefix hits
    std::optional<SequenceImage> import;  // an Import: what Commit makes the sequence
  };
  struct Sequence {
    LeaseId owner = 0;
    std::vector<BlockId> blocks;
    int64_t length = 0;
    uint64_t full_hash = 0;     // chain hash of the last full block
    std::vector<int32_t> tail;  // tokens of the partial last block
    std::vector<TokenDigest> tail_digests;  // and their digests
    SharingScope scope;
    bool has_pending = false;
    Pending pending;
    uint64_t incarnation = 0;
  };

  absl::StatusOr<Sequence*> Find(SeqId seq);
  void Changed(SeqId seq) {
    if (changes_ != nullptr) changes_->insert(seq);
  }

  BlockAllocator* allocator_;
  int32_t block_size_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  // Staged blocks by sequence: their owner and the staged copy of each source block.
  struct Staged {
    LeaseId owner = 0;
    absl::flat_hash_map<BlockId, BlockId> copies;  // source block -> reserved block here
  };
  absl::flat_hash_map<SeqId, Staged> staged_;
  absl::flat_hash_set<SeqId>* changes_ = nullptr;
  uint64_t next_incarnation_ = 1;
};

}  // namespace kvp
