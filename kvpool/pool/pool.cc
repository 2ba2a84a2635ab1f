#include "kvpool/pool/pool.h"

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
  return std::unique_ptr<Pool>(new Pool(std::move(layout), static_cast<int32_t>(blocks)));
}

Pool::Pool(BlockLayout layout, int32_t num_blocks)
    : layout_(std::move(layout)),
      blocks_(num_blocks),
      sequences_(&blocks_, layout_.spec().block_size) {}

void Pool::ForgetLease(LeaseId lease) {
  sequences_.ForgetLease(lease);
  blocks_.ReleaseLease(lease);
}

absl::Status Pool::CheckInvariants() const {
  RETURN_IF_ERROR(blocks_.CheckInvariants());
  return sequences_.CheckAgainst(blocks_);
}

}  // namespace kvp
