#include "kvpool/pool/sequence_table.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/layout/layer_cache.h"
#include "kvpool/pool/prefix_hash.h"

namespace kvp {

SequenceTable::SequenceTable(BlockAllocator* allocator, int32_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

absl::StatusOr<SequenceTable::Sequence*> SequenceTable::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return &it->second;
}

absl::StatusOr<AppendPlan> SequenceTable::Append(SeqId seq, LeaseId lease,
                                                 absl::Span<const int32_t> tokens,
                                                 absl::Span<const TokenDigest> digests,
                                                 const std::optional<SharingScope>& scope) {
  if (!digests.empty() && digests.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("an append of ", tokens.size(), " tokens with ",
                                                   digests.size(), " content digests"));
  }
  auto [it, created] = seqs_.try_emplace(seq);
  Sequence& s = it->second;
  if (created) {
    s.owner = lease;
    s.scope = scope.value_or(SharingScope());
    s.full_hash = s.scope.root;
    s.incarnation = next_incarnation_++;
  } else if (scope.has_value() && !(*scope == s.scope)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", seq, " was created in another cache namespace; it keeps that one"));
  } else if (s.owner != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " belongs to lease ", s.owner, ", not ", lease));
  } else if (s.has_pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has an append that is neither committed nor aborted"));
  }
  Pending p;
  p.old_length = s.length;
  p.old_block_count = s.blocks.size();
  p.tokens.assign(tokens.begin(), tokens.end());
  p.digests.assign(digests.begin(), digests.end());
  std::vector<BlockId>& blocks = s.blocks;  // changed in place; Abort undoes
  size_t next = 0;

  // Prefix hits: only a shared sequence that starts empty can take whole committed blocks.
  if (s.length == 0 && s.scope.shared) {
    PrefixKey key;
    key.hash = s.full_hash;
    key.root = s.scope.root;
    while (tokens.size() - next >= static_cast<size_t>(block_size_)) {
      key.tokens.assign(tokens.begin() + next, tokens.begin() + next + block_size_);
      key.content = digests.empty() ? kSyntheticTokenDigest
                                    : BlockDigest(digests.subspan(next, block_size_));
      key.hash = ChainPrefixHash(key.hash, key.tokens, key.content);
      const std::optional<BlockId> hit = allocator_->FindPrefix(key);
      if (!hit.has_value()) break;
      if (absl::Status ref = allocator_->AddRef(lease, *hit); !ref.ok()) {
        for (BlockId b : p.hit_blocks) allocator_->Release(lease, b).IgnoreError();
        if (created) seqs_.erase(it);
        return ref;
      }
      p.hit_blocks.push_back(*hit);
      next += block_size_;
    }
    p.plan.prefix_hit_tokens = static_cast<int32_t>(next);
    blocks.insert(blocks.end(), p.hit_blocks.begin(), p.hit_blocks.end());
  }

  const int64_t start = s.length + static_cast<int64_t>(next);
  const int64_t end = s.length + static_cast<int64_t>(tokens.size());
  const int64_t have = static_cast<int64_t>(blocks.size()) * block_size_;
  const bool partial = start % block_size_ != 0 && start < end;
  const bool shared_tail = partial && allocator_->RefCount(blocks.back()) > 1;
  const int64_t fresh = BlocksForTokens(std::max<int64_t>(end - have, 0), block_size_);
  absl::StatusOr<std::vector<BlockId>> reserved =
      allocator_->Reserve(lease, static_cast<int>(fresh + (shared_tail ? 1 : 0)));
  if (!reserved.ok()) {
    for (BlockId b : p.hit_blocks) allocator_->Release(lease, b).IgnoreError();
    blocks.resize(p.old_block_count);
    if (created) seqs_.erase(it);
    return reserved.status();
  }
  p.plan.reserved = *reserved;
  size_t take = 0;
  if (shared_tail) {
    // Copy-on-write of the partial last block, shared with a fork.
    const BlockId copy = p.plan.reserved[take++];
    p.plan.copies.emplace_back(blocks.back(), copy);
    blocks.back() = copy;
  }
  while (take < p.plan.reserved.size()) blocks.push_back(p.plan.reserved[take++]);
  for (int64_t pos = start; pos < end; ++pos) {
    p.plan.slots.push_back(SlotOfPosition(blocks.data(), pos, block_size_));
  }
  s.has_pending = true;
  s.pending = std::move(p);
  return s.pending.plan;
}

absl::StatusOr<SequenceImage> SequenceTable::Image(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  const Sequence& s = it->second;
  if (s.has_pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has an append that is neither committed nor aborted"));
  }
  SequenceImage image{.scope = s.scope,
                      .length = s.length,
                      .full_hash = s.full_hash,
                      .tail = s.tail,
                      .tail_digests = s.tail_digests,
                      .blocks = s.blocks,
                      .keys = {}};
  image.keys.reserve(s.blocks.size());
  for (BlockId b : s.blocks) image.keys.push_back(allocator_->PrefixOf(b));
  return image;
}

absl::StatusOr<std::vector<BlockMove>> SequenceTable::Import(SeqId seq, LeaseId lease,
                                                             SequenceImage image,
                                                             size_t* staged_taken) {
  if (seqs_.contains(seq)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", seq, " is in this pool already"));
  }
  if (image.keys.size() != image.blocks.size()) {
    return absl::InvalidArgumentError("an image needs one (optional) key per block");
  }
  std::vector<BlockId> table(image.blocks.size(), -1);
  std::vector<BlockId> hits;
  for (size_t i = 0; i < image.blocks.size(); ++i) {
    if (!image.keys[i].has_value()) continue;
    const std::optional<BlockId> hit = allocator_->FindPrefix(*image.keys[i]);
    if (!hit.has_value()) continue;
    if (absl::Status ref = allocator_->AddRef(lease, *hit); !ref.ok()) {
      for (BlockId b : hits) allocator_->Release(lease, b).IgnoreError();
      return ref;
    }
    hits.push_back(*hit);
    table[i] = *hit;
  }
  // Staged copies stand in for the blocks they copied; a hit is taken over a staged copy.
  auto staged = staged_.find(seq);
  if (staged != staged_.end() && staged->second.owner != lease) staged = staged_.end();
  absl::flat_hash_set<BlockId> taken;
  for (size_t i = 0; i < table.size() && staged != staged_.end(); ++i) {
    if (table[i] >= 0) continue;
    if (auto copy = staged->second.copies.find(image.blocks[i]);
        copy != staged->second.copies.end()) {
      table[i] = copy->second;
      taken.insert(copy->second);
    }
  }
  const int misses = static_cast<int>(image.blocks.size() - hits.size() - taken.size());
  absl::StatusOr<std::vector<BlockId>> reserved = allocator_->Reserve(lease, misses);
  if (!reserved.ok()) {  // nothing changes: the staged blocks stay staged
    for (BlockId b : hits) allocator_->Release(lease, b).IgnoreError();
    return reserved.status();
  }
  if (staged != staged_.end()) {
    for (const auto& [source, copy] : staged->second.copies) {
      if (!taken.contains(copy)) allocator_->Abort(lease, copy).IgnoreError();
    }
    staged_.erase(staged);
  }
  std::vector<BlockMove> moves;
  moves.reserve(misses);
  for (size_t i = 0, next = 0; i < table.size(); ++i) {
    if (table[i] >= 0) continue;
    table[i] = (*reserved)[next++];
    moves.push_back({.source = image.blocks[i], .target = table[i]});
  }
  reserved->insert(reserved->end(), taken.begin(), taken.end());  // committed with the rest
  if (staged_taken != nullptr) *staged_taken = taken.size();
  Sequence& s = seqs_[seq];
  s.owner = lease;
  s.incarnation = next_incarnation_++;
  s.scope = image.scope;
  s.full_hash = image.scope.root;
  s.blocks = std::move(table);
  s.has_pending = true;
  s.pending.plan.reserved = *std::move(reserved);
  s.pending.hit_blocks = std::move(hits);
  s.pending.import = std::move(image);
  return moves;
}

absl::StatusOr<std::vector<BlockMove>> SequenceTable::Stage(SeqId seq, LeaseId lease,
                                                            absl::Span<const BlockId> sources) {
  if (seqs_.contains(seq)) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " is in this pool already: nothing to stage"));
  }
  auto it = staged_.find(seq);
  if (it != staged_.end() && it->second.owner != lease) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has blocks staged by another lease"));
  }
  std::vector<BlockId> wanted;
  for (BlockId b : sources) {
    const bool known = (it != staged_.end() && it->second.copies.contains(b)) ||
                       std::find(wanted.begin(), wanted.end(), b) != wanted.end();
    if (!known) wanted.push_back(b);
  }
  ASSIGN_OR_RETURN(const std::vector<BlockId> reserved,
                   allocator_->Reserve(lease, static_cast<int>(wanted.size())));
  Staged& staged = staged_[seq];
  staged.owner = lease;
  std::vector<BlockMove> moves;
  moves.reserve(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    staged.copies.emplace(wanted[i], reserved[i]);
    moves.push_back({.source = wanted[i], .target = reserved[i]});
  }
  if (staged.copies.empty()) staged_.erase(seq);
  return moves;
}

void SequenceTable::Unstage(SeqId seq, absl::Span<const BlockMove> moves) {
  auto it = staged_.find(seq);
  if (it == staged_.end()) return;
  Staged& staged = it->second;
  for (const BlockMove& m : moves) {
    auto copy = staged.copies.find(m.source);
    if (copy == staged.copies.end() || copy->second != m.target) continue;
    allocator_->Abort(staged.owner, copy->second).IgnoreError();
    staged.copies.erase(copy);
  }
  if (staged.copies.empty()) staged_.erase(it);
}

void SequenceTable::DropStaged(SeqId seq) {
  auto it = staged_.find(seq);
  if (it == staged_.end()) return;
  for (const auto& [source, copy] : it->second.copies) {
    allocator_->Abort(it->second.owner, copy).IgnoreError();
  }
  staged_.erase(it);
}

size_t SequenceTable::StagedBlocks(SeqId seq) const {
  auto it = staged_.find(seq);
  return it == staged_.end() ? 0 : it->second.copies.size();
}

bool SequenceTable::Importing(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.has_pending && it->second.pending.import.has_value();
}

absl::Status SequenceTable::Commit(SeqId seq) {
  ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  if (!s->has_pending) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has nothing to commit"));
  }
  Pending& p = s->pending;
  const LeaseId lease = s->owner;
  if (p.import.has_value()) {
    SequenceImage& image = *p.import;
    const absl::flat_hash_set<BlockId> reserved(p.plan.reserved.begin(), p.plan.reserved.end());
    for (size_t i = 0; i < s->blocks.size(); ++i) {
      const BlockId b = s->blocks[i];
      if (reserved.contains(b)) RETURN_IF_ERROR(allocator_->Commit(lease, b, std::move(image.keys[i])));
    }
    s->length = image.length;
    s->full_hash = image.full_hash;
    s->tail = std::move(image.tail);
    s->tail_digests = std::move(image.tail_digests);
    s->has_pending = false;
    s->pending = Pending();
    Changed(seq);
    return absl::OkStatus();
  }
  // Walk the appended tokens block by block, extending the prefix chain; a block that fills up
  // gets its key, whether it was reserved now or written into before. Only blocks from the one
  // holding the old end onward can change, so the work is proportional to the append.
  const size_t first = static_cast<size_t>(p.old_length / block_size_);
  std::vector<std::optional<PrefixKey>> keys(s->blocks.size() - first);
  int64_t pos = p.old_length;
  for (size_t i = 0; i < p.tokens.size(); ++i) {
    s->tail.push_back(p.tokens[i]);
    s->tail_digests.push_back(p.digests.empty() ? kSyntheticTokenDigest : p.digests[i]);
    ++pos;
    if (pos % block_size_ == 0) {
      const TokenDigest content = BlockDigest(s->tail_digests);
      s->full_hash = ChainPrefixHash(s->full_hash, s->tail, content);
      if (s->scope.shared) {
        keys[pos / block_size_ - 1 - first] = PrefixKey{.hash = s->full_hash,
                                                        .root = s->scope.root,
                                                        .tokens = std::move(s->tail),
                                                        .content = content};
      }
      s->tail.clear();
      s->tail_digests.clear();
    }
  }
  for (const auto& [old_block, copy] : p.plan.copies) {
    RETURN_IF_ERROR(allocator_->Release(lease, old_block));
  }
  for (size_t i = first; i < s->blocks.size(); ++i) {
    const BlockId b = s->blocks[i];
    const bool reserved_now =
        std::find(p.plan.reserved.begin(), p.plan.reserved.end(), b) != p.plan.reserved.end();
    if (reserved_now) {
      RETURN_IF_ERROR(allocator_->Commit(lease, b, std::move(keys[i - first])));
    } else if (keys[i - first].has_value()) {
      RETURN_IF_ERROR(allocator_->Index(b, *std::move(keys[i - first])));
    }
  }
  s->length = pos;
  s->has_pending = false;
  s->pending = Pending();
  Changed(seq);
  return absl::OkStatus();
}

absl::Status SequenceTable::Abort(SeqId seq) {
  ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  if (!s->has_pending) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has nothing to abort"));
  }
  for (BlockId b : s->pending.plan.reserved) RETURN_IF_ERROR(allocator_->Abort(s->owner, b));
  for (BlockId b : s->pending.hit_blocks) RETURN_IF_ERROR(allocator_->Release(s->owner, b));
  const Pending& p = s->pending;
  s->blocks.resize(p.old_block_count);
  // A copy-on-write replaced the partial last block, the only one an append can change.
  if (!p.plan.copies.empty()) s->blocks.back() = p.plan.copies.front().first;
  s->has_pending = false;
  s->pending = Pending();
  if (s->blocks.empty() && s->length == 0) seqs_.erase(seq);
  return absl::OkStatus();
}

absl::Status SequenceTable::Fork(SeqId src, SeqId dst, LeaseId lease) {
  ASSIGN_OR_RETURN(Sequence * from, Find(src));
  if (from->has_pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", src, " has a pending append; fork after it commits"));
  }
  if (seqs_.contains(dst))
    return absl::AlreadyExistsError(absl::StrCat("sequence ", dst, " exists"));
  Sequence copy;
  copy.owner = lease;
  copy.incarnation = next_incarnation_++;
  copy.blocks = from->blocks;
  copy.length = from->length;
  copy.full_hash = from->full_hash;
  copy.tail = from->tail;
  copy.tail_digests = from->tail_digests;
  copy.scope = from->scope;
  for (BlockId b : copy.blocks) RETURN_IF_ERROR(allocator_->AddRef(lease, b));
  seqs_.emplace(dst, std::move(copy));
  Changed(dst);
  return absl::OkStatus();
}

absl::Status SequenceTable::Release(SeqId seq) {
  ASSIGN_OR_RETURN(Sequence * s, Find(seq));
  if (s->has_pending) RETURN_IF_ERROR(Abort(seq));
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::OkStatus();  // an aborted first append removed it
  for (BlockId b : it->second.blocks) RETURN_IF_ERROR(allocator_->Release(it->second.owner, b));
  seqs_.erase(it);
  Changed(seq);
  return absl::OkStatus();
}

absl::Status SequenceTable::CheckAgainst(
    const BlockAllocator& allocator,
    const absl::flat_hash_map<LeaseId, LeaseHoldings>& outside) const {
  absl::flat_hash_map<LeaseId, LeaseHoldings> expected = outside;
  for (const auto& [seq, staged] : staged_) {
    LeaseHoldings& h = expected[staged.owner];
    for (const auto& [source, copy] : staged.copies) {
      if (!h.reserved.insert(copy).second) {
        return absl::InternalError(absl::StrCat("block ", copy, " is staged twice"));
      }
    }
  }
  for (const auto& [id, s] : seqs_) {
    LeaseHoldings& h = expected[s.owner];
    const std::vector<BlockId>& reserved = s.pending.plan.reserved;
    for (BlockId b : s.blocks) {
      if (s.has_pending && std::find(reserved.begin(), reserved.end(), b) != reserved.end()) {
        if (!h.reserved.insert(b).second) {
          return absl::InternalError(absl::StrCat("block ", b, " is reserved twice in tables"));
        }
      } else {
        ++h.refs[b];
      }
    }
    if (s.has_pending) {
      for (const auto& [old_block, copy] : s.pending.plan.copies) ++h.refs[old_block];
    }
  }
  absl::erase_if(expected, [](const auto& e) { return e.second.empty(); });
  const absl::flat_hash_map<LeaseId, LeaseHoldings> actual = allocator.Holdings();
  if (expected.size() != actual.size()) {
    return absl::InternalError(absl::StrCat(actual.size(), " leases hold blocks; the tables say ",
                                            expected.size()));
  }
  for (const auto& [lease, h] : expected) {
    auto it = actual.find(lease);
    if (it == actual.end() || !(it->second == h)) {
      return absl::InternalError(
          absl::StrCat("lease ", lease, " holds other blocks than its sequences' tables say"));
    }
  }
  return absl::OkStatus();
}

int64_t SequenceTable::ForgetLease(LeaseId lease) {
  absl::erase_if(staged_, [&](const auto& entry) { return entry.second.owner == lease; });
  return static_cast<int64_t>(absl::erase_if(seqs_, [&](const auto& entry) {
    if (entry.second.owner != lease) return false;
    Changed(entry.first);
    return true;
  }));
}

std::optional<CommittedSequence> SequenceTable::Committed(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return std::nullopt;
  const Sequence& s = it->second;
  // A pending append leaves length, chain hash and tail as committed, and changes the block
  // table only past the committed blocks, apart from a copy-on-write of the last one.
  size_t committed_blocks = s.blocks.size();
  if (s.has_pending) {
    if (s.pending.import.has_value()) return std::nullopt;
    committed_blocks = s.pending.old_block_count;
  }
  if (s.length == 0 && committed_blocks == 0) return std::nullopt;
  CommittedSequence c{.owner = s.owner,
                      .image = {.scope = s.scope,
                                .length = s.length,
                                .full_hash = s.full_hash,
                                .tail = s.tail,
                                .tail_digests = s.tail_digests,
                                .blocks = {s.blocks.begin(), s.blocks.begin() + committed_blocks},
                                .keys = {}},
                      .incarnation = s.incarnation};
  if (s.has_pending && !s.pending.plan.copies.empty()) {
    c.image.blocks.back() = s.pending.plan.copies.front().first;
  }
  return c;
}

absl::Status SequenceTable::Restore(SeqId seq, CommittedSequence c) {
  const SequenceImage& image = c.image;
  const int64_t tail = image.length % block_size_;
  if (image.length <= 0 ||
      static_cast<int64_t>(image.blocks.size()) != BlocksForTokens(image.length, block_size_) ||
      static_cast<int64_t>(image.tail.size()) != tail ||
      image.tail_digests.size() != image.tail.size()) {
    return absl::DataLossError(absl::StrCat("sequence ", seq, ": ", image.length, " tokens in ",
                                            image.blocks.size(), " blocks with a tail of ",
                                            image.tail.size(), " do not agree"));
  }
  Sequence s;
  s.owner = c.owner;
  s.incarnation = next_incarnation_++;
  s.blocks = std::move(c.image.blocks);
  s.length = image.length;
  s.full_hash = image.full_hash;
  s.tail = std::move(c.image.tail);
  s.tail_digests = std::move(c.image.tail_digests);
  s.scope = image.scope;
  if (!seqs_.emplace(seq, std::move(s)).second) {
    return absl::DataLossError(absl::StrCat("sequence ", seq, " is restored twice"));
  }
  return absl::OkStatus();
}

std::vector<SeqId> SequenceTable::Ids() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

absl::StatusOr<int64_t> SequenceTable::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return it->second.length;
}

absl::StatusOr<LeaseId> SequenceTable::Owner(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return it->second.owner;
}

absl::StatusOr<bool> SequenceTable::HasPending(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return it->second.has_pending;
}

absl::StatusOr<absl::Span<const BlockId>> SequenceTable::Blocks(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return it->second.blocks;
}

}  // namespace kvp
