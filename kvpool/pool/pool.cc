#include "kvpool/pool/pool.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {

absl::StatusOr<std::unique_ptr<Pool>> Pool::Create(const PoolSpec& spec, uint64_t arena_bytes) {
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
  const uint64_t blocks = arena_bytes / static_cast<uint64_t>(layout.block_stride());
  if (blocks == 0 || blocks > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("an arena of ", arena_bytes, " bytes holds ",
                                                   blocks, " blocks of ", layout.block_stride(),
                                                   " bytes; need 1 to 2^31 - 1"));
  }
  // Sparse MLA decode takes the top-k as int32 physical slots (kernels/mla/mla_params.h).
  if (spec.mla() && blocks * static_cast<uint64_t>(spec.block_size) > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an MLA pool of ", blocks, " blocks has more than 2^31 - 1 token slots; use a smaller "
        "arena or more pools"));
  }
  return std::unique_ptr<Pool>(new Pool(std::move(layout), static_cast<int32_t>(blocks)));
}

Pool::Pool(BlockLayout layout, int32_t num_blocks)
    : layout_(std::move(layout)),
      blocks_(num_blocks),
      sequences_(&blocks_, layout_.spec().block_size) {}

void Pool::ForgetLease(LeaseId lease) {
  sequences_.ForgetLease(lease);
  blocks_.ReleaseLease(lease);
  if (lease == quarantine_ && quarantine_ != 0) {
    quarantine_ = 0;
    quarantined_ = LeaseHoldings();
  }
}

void Pool::TrackChanges() {
  tracking_ = true;
  blocks_.TrackChanges(&changes_.indexed, &changes_.reserved);
  sequences_.TrackChanges(&changes_.sequences);
}

PoolImage Pool::Capture() const {
  PoolImage image;
  image.indexed = blocks_.Indexed();
  for (BlockId b = 0; b < blocks_.num_blocks(); ++b) {
    if (blocks_.IsReserved(b)) image.reserved.push_back(b);
  }
  std::vector<SeqId> ids = sequences_.Ids();
  std::sort(ids.begin(), ids.end());
  image.sequences.reserve(ids.size());
  for (SeqId seq : ids) {
    if (std::optional<CommittedSequence> c = sequences_.Committed(seq); c.has_value()) {
      image.sequences.emplace_back(seq, *std::move(c));
    }
  }
  return image;
}

absl::Status Pool::Restore(PoolImage image, LeaseId quarantine) {
  std::vector<std::pair<LeaseId, BlockId>> refs;
  for (const auto& [seq, c] : image.sequences) {
    for (BlockId b : c.image.blocks) refs.emplace_back(c.owner, b);
  }
  const int32_t num_blocks = blocks_.num_blocks();
  absl::Status restored = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(blocks_, BlockAllocator::Restore(num_blocks, std::move(image.indexed), refs,
                                                      image.reserved, quarantine));
    sequences_ = SequenceTable(&blocks_, layout_.spec().block_size);
    quarantine_ = quarantine;
    quarantined_ = LeaseHoldings();
    quarantined_.reserved.insert(image.reserved.begin(), image.reserved.end());
    for (auto& [seq, c] : image.sequences) RETURN_IF_ERROR(sequences_.Restore(seq, std::move(c)));
    if (absl::Status s = CheckInvariants(); !s.ok()) return absl::DataLossError(s.message());
    return absl::OkStatus();
  }();
  if (!restored.ok()) {
    blocks_ = BlockAllocator(num_blocks);
    sequences_ = SequenceTable(&blocks_, layout_.spec().block_size);
    quarantine_ = 0;
    quarantined_ = LeaseHoldings();
  }
  changes_ = PoolChanges();
  if (tracking_) TrackChanges();  // the tables were replaced
  return restored;
}

absl::Status Pool::CheckInvariants() const {
  RETURN_IF_ERROR(blocks_.CheckInvariants());
  absl::flat_hash_map<LeaseId, LeaseHoldings> outside_tables;
  if (quarantine_ != 0 && !quarantined_.empty()) outside_tables[quarantine_] = quarantined_;
  return sequences_.CheckAgainst(blocks_, outside_tables);
}

}  // namespace kvp
