#include "kvpool/pool/block_allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/pool/prefix_hash.h"

namespace kvp {
namespace {

PrefixKey Key(std::vector<int32_t> tokens, uint64_t parent = kRootPrefixHash) {
  const uint64_t hash = ChainPrefixHash(parent, tokens, kSyntheticTokenDigest);
  return PrefixKey{
      .hash = hash, .root = kRootPrefixHash, .tokens = std::move(tokens), .content = {}};
}

TEST(BlockAllocatorTest, TwoPhaseWritesOnlyCommittedBlocksAreReadable) {
  BlockAllocator a(4);
  auto blocks = a.Reserve(1, 2).value();
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_FALSE(a.IsCommitted(blocks[0]));
  EXPECT_EQ(a.AddRef(2, blocks[0]).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Commit(1, blocks[0], std::nullopt).ok());
  EXPECT_TRUE(a.IsCommitted(blocks[0]));
  EXPECT_EQ(a.Commit(2, blocks[1], std::nullopt).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Abort(1, blocks[1]).ok());
  EXPECT_EQ(a.Abort(1, blocks[1]).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.counts().used, 1);
  EXPECT_EQ(a.counts().free, 3);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, ReleasedPrefixBlocksAreCachedThenEvictedLeastRecentFirst) {
  BlockAllocator a(3);
  auto b = a.Reserve(1, 3).value();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(a.Commit(1, b[i], i < 2 ? std::optional(Key({i})) : std::nullopt).ok());
  ASSERT_TRUE(a.Release(1, b[1]).ok());  // cached, released first
  ASSERT_TRUE(a.Release(1, b[0]).ok());  // cached
  ASSERT_TRUE(a.Release(1, b[2]).ok());  // no prefix: free
  EXPECT_EQ(a.counts().cached, 2);
  EXPECT_EQ(a.FindPrefix(Key({1})), b[1]);
  auto two = a.Reserve(2, 2).value();  // the free one, then evicts b[1] (oldest)
  EXPECT_EQ(two, (std::vector<BlockId>{b[2], b[1]}));
  EXPECT_EQ(a.evictions(), 1u);
  EXPECT_FALSE(a.FindPrefix(Key({1})).has_value());
  EXPECT_EQ(a.FindPrefix(Key({0})), b[0]);
  // A prefix hit takes the cached block back into use.
  ASSERT_TRUE(a.AddRef(3, b[0]).ok());
  EXPECT_EQ(a.counts().cached, 0);
  EXPECT_EQ(a.Reserve(4, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, PrefixLookupComparesTokensNotJustHashes) {
  BlockAllocator a(2);
  auto b = a.Reserve(1, 1).value();
  PrefixKey key = Key({5, 6, 7});
  ASSERT_TRUE(a.Commit(1, b[0], key).ok());
  EXPECT_EQ(a.FindPrefix(key), b[0]);
  PrefixKey other_tokens = key;
  other_tokens.tokens = {5, 6, 8};
  EXPECT_FALSE(a.FindPrefix(other_tokens).has_value());
}

TEST(BlockAllocatorTest, PrefixLookupComparesNamespaceAndContentToo) {
  BlockAllocator a(2);
  auto b = a.Reserve(1, 1).value();
  const PrefixKey key = Key({5, 6, 7});
  ASSERT_TRUE(a.Commit(1, b[0], key).ok());
  PrefixKey other_root = key;
  other_root.root = 99;
  EXPECT_FALSE(a.FindPrefix(other_root).has_value());
  PrefixKey other_content = key;
  other_content.content = TokenDigest{1, 2};
  EXPECT_FALSE(a.FindPrefix(other_content).has_value());
}

TEST(BlockAllocatorTest, ReleasingALeaseReturnsItsReservationsAndReferences) {
  BlockAllocator a(6);
  auto mine = a.Reserve(7, 4).value();
  ASSERT_TRUE(a.Commit(7, mine[0], std::nullopt).ok());
  ASSERT_TRUE(a.Commit(7, mine[1], Key({1})).ok());
  ASSERT_TRUE(a.AddRef(8, mine[0]).ok());  // another lease shares block 0
  EXPECT_EQ(a.ReleaseLease(7), 4);         // 2 reservations + 2 references
  EXPECT_EQ(a.RefCount(mine[0]), 1);
  PoolCounts c = a.counts();
  EXPECT_EQ(c.reserved, 0);
  EXPECT_EQ(c.used, 1);
  EXPECT_EQ(c.cached, 1);
  EXPECT_EQ(c.free, 4);
  EXPECT_EQ(a.ReleaseLease(7), 0);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

// >= 100,000 random operations; after each: the invariants, and a model of who holds what.
TEST(BlockAllocatorTest, RandomOperationsNeverHandABlockOutTwice) {
  std::mt19937_64 rng(std::random_device{}());
  constexpr int kBlocks = 64;
  BlockAllocator a(kBlocks);
  std::map<LeaseId, std::set<BlockId>> reserved;   // model: reservations per lease
  std::map<LeaseId, std::multiset<BlockId>> refs;  // model: references per lease
  std::vector<BlockId> committed;
  auto pick = [&](auto& container) {
    auto it = container.begin();
    std::advance(it, rng() % container.size());
    return it;
  };
  int ops = 0, exhausted = 0;
  for (; ops < 120000; ++ops) {
    const LeaseId lease = 1 + rng() % 6;
    switch (rng() % 8) {
      case 0:
      case 1: {  // reserve
        const int n = 1 + static_cast<int>(rng() % 4);
        auto got = a.Reserve(lease, n);
        if (!got.ok()) {
          ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
          ++exhausted;
          break;
        }
        for (BlockId b : *got) {
          for (auto& [l, set] : reserved)
            ASSERT_FALSE(set.count(b)) << "block " << b << " handed out twice";
          for (auto& [l, set] : refs)
            ASSERT_FALSE(set.count(b)) << "evicted block " << b << " still referenced";
          reserved[lease].insert(b);
          committed.erase(std::remove(committed.begin(), committed.end(), b), committed.end());
        }
        break;
      }
      case 2:
      case 3: {  // commit, sometimes with a prefix
        if (reserved[lease].empty()) break;
        auto it = pick(reserved[lease]);
        const BlockId b = *it;
        std::optional<PrefixKey> key;
        if (rng() % 2) key = Key({static_cast<int32_t>(rng() % 32)});
        ASSERT_TRUE(a.Commit(lease, b, key).ok());
        reserved[lease].erase(it);
        refs[lease].insert(b);
        committed.push_back(b);
        break;
      }
      case 4: {  // abort
        if (reserved[lease].empty()) break;
        auto it = pick(reserved[lease]);
        ASSERT_TRUE(a.Abort(lease, *it).ok());
        reserved[lease].erase(it);
        break;
      }
      case 5: {  // share (fork / prefix hit)
        if (committed.empty()) break;
        const BlockId b = committed[rng() % committed.size()];
        if (!a.IsCommitted(b)) break;
        ASSERT_TRUE(a.AddRef(lease, b).ok());
        refs[lease].insert(b);
        break;
      }
      case 6: {  // release one reference
        if (refs[lease].empty()) break;
        auto it = pick(refs[lease]);
        ASSERT_TRUE(a.Release(lease, *it).ok());
        refs[lease].erase(it);
        break;
      }
      default: {  // lease expiry
        if (rng() % 8 != 0) break;
        const int64_t expected = static_cast<int64_t>(reserved[lease].size() + refs[lease].size());
        ASSERT_EQ(a.ReleaseLease(lease), expected);
        reserved.erase(lease);
        refs.erase(lease);
      }
    }
    ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants() << " after op " << ops;
    int64_t model_refs_total = 0;
    for (auto& [l, set] : refs) model_refs_total += static_cast<int64_t>(set.size());
    int64_t refcounts = 0;
    for (BlockId b = 0; b < kBlocks; ++b) refcounts += a.RefCount(b);
    ASSERT_EQ(refcounts, model_refs_total) << "references not conserved";
    const PoolCounts c = a.counts();
    ASSERT_EQ(c.free + c.reserved + c.used + c.cached, kBlocks);
  }
  EXPECT_GT(exhausted, 100);  // the pool ran full and eviction was exercised
}

}  // namespace
}  // namespace kvp
