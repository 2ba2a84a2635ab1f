#include "kvpool/pool/sequence_table.h"

#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/pool/lease_table.h"

namespace kvp {
namespace {

// A sequence's blocks as they are now (Blocks is a view that follows later changes).
std::vector<BlockId> Copy(absl::StatusOr<absl::Span<const BlockId>> blocks) {
  return std::vector<BlockId>(blocks->begin(), blocks->end());
}

std::vector<int32_t> Tokens(int n, int first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(SequenceTableTest, AppendsPlanSlotsAcrossBlocksAndCommitMakesThemReadable) {
  BlockAllocator a(8);
  SequenceTable seqs(&a, 4);
  AppendPlan p = seqs.Append(1, 9, Tokens(6)).value();
  ASSERT_EQ(p.reserved.size(), 2u);
  EXPECT_EQ(p.slots, (std::vector<int64_t>{p.reserved[0] * 4, p.reserved[0] * 4 + 1,
                                           p.reserved[0] * 4 + 2, p.reserved[0] * 4 + 3,
                                           p.reserved[1] * 4, p.reserved[1] * 4 + 1}));
  EXPECT_FALSE(a.IsCommitted(p.reserved[0]));
  EXPECT_EQ(seqs.Append(1, 9, Tokens(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(seqs.Commit(1).ok());
  EXPECT_TRUE(a.IsCommitted(p.reserved[0]));
  EXPECT_EQ(seqs.Length(1).value(), 6);
  // The next append fills the partial block first.
  AppendPlan q = seqs.Append(1, 9, Tokens(3, 200)).value();
  EXPECT_EQ(q.slots.front(), p.reserved[1] * 4 + 2);
  EXPECT_EQ(q.reserved.size(), 1u);
  ASSERT_TRUE(seqs.Commit(1).ok());
  EXPECT_EQ(seqs.Length(1).value(), 9);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, AbortLeavesTheSequenceAsItWas) {
  BlockAllocator a(8);
  SequenceTable seqs(&a, 4);
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(5)).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  const std::vector<BlockId> before = Copy(seqs.Blocks(1));
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(10)).ok());
  ASSERT_TRUE(seqs.Abort(1).ok());
  EXPECT_EQ(Copy(seqs.Blocks(1)), before);
  EXPECT_EQ(seqs.Length(1).value(), 5);
  EXPECT_EQ(a.counts().reserved, 0);
  // An aborted first append leaves no sequence behind.
  ASSERT_TRUE(seqs.Append(2, 9, Tokens(3)).ok());
  ASSERT_TRUE(seqs.Abort(2).ok());
  EXPECT_FALSE(seqs.Contains(2));
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, ANewSequenceReusesCommittedPrefixBlocks) {
  BlockAllocator a(8);
  SequenceTable seqs(&a, 4);
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(10)).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  const std::vector<BlockId> first = Copy(seqs.Blocks(1));
  // Same first 8 tokens, then different: two full blocks hit, the rest is written.
  std::vector<int32_t> other = Tokens(10);
  other[9] = -1;
  AppendPlan p = seqs.Append(2, 7, other).value();
  EXPECT_EQ(p.prefix_hit_tokens, 8);
  EXPECT_EQ(p.slots.size(), 2u);
  ASSERT_TRUE(seqs.Commit(2).ok());
  const std::vector<BlockId> second = Copy(seqs.Blocks(2));
  EXPECT_EQ(second[0], first[0]);
  EXPECT_EQ(second[1], first[1]);
  EXPECT_NE(second[2], first[2]);
  EXPECT_EQ(a.RefCount(first[0]), 2);
  // Released sequences leave their full blocks cached, still findable.
  ASSERT_TRUE(seqs.Release(1).ok());
  ASSERT_TRUE(seqs.Release(2).ok());
  EXPECT_EQ(a.counts().cached, 2);
  AppendPlan again = seqs.Append(3, 7, Tokens(8)).value();
  EXPECT_EQ(again.prefix_hit_tokens, 8);
  EXPECT_TRUE(again.reserved.empty());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, PrefixHitsNeedTheSameContentNotJustTheSameTokens) {
  BlockAllocator a(16);
  SequenceTable seqs(&a, 4);
  std::vector<TokenDigest> mine(8), theirs(8);
  for (uint64_t i = 0; i < 8; ++i) {
    mine[i] = TokenDigest{i + 1, 7};
    theirs[i] = TokenDigest{i + 1, 8};
  }
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(8), mine).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  // Same ids, other tensors: nothing shared. Same tensors: both blocks. Synthetic: nothing.
  EXPECT_EQ(seqs.Append(2, 7, Tokens(8), theirs).value().prefix_hit_tokens, 0);
  EXPECT_EQ(seqs.Append(3, 7, Tokens(8), mine).value().prefix_hit_tokens, 8);
  EXPECT_EQ(seqs.Append(4, 7, Tokens(8)).value().prefix_hit_tokens, 0);
  // A block whose second half differs shares only the first block.
  std::vector<TokenDigest> half = mine;
  half[6] = TokenDigest{99, 99};
  EXPECT_EQ(seqs.Append(5, 7, Tokens(8), half).value().prefix_hit_tokens, 4);
  EXPECT_EQ(seqs.Append(6, 7, Tokens(8), mine).status().code(), absl::StatusCode::kOk);
  EXPECT_EQ(seqs.Append(7, 7, Tokens(8), std::vector<TokenDigest>(3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, NamespacesNeverShareAndUnsharedSequencesAreNeverFound) {
  BlockAllocator a(16);
  SequenceTable seqs(&a, 4);
  const SharingScope red{.root = 111}, blue{.root = 222}, hidden{.root = 111, .shared = false};
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(8), {}, red).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  EXPECT_EQ(seqs.Append(2, 7, Tokens(8), {}, blue).value().prefix_hit_tokens, 0);
  EXPECT_EQ(seqs.Append(3, 7, Tokens(8)).value().prefix_hit_tokens, 0);
  EXPECT_EQ(seqs.Append(4, 7, Tokens(8), {}, red).value().prefix_hit_tokens, 8);
  // An unshared sequence takes no hits and leaves none.
  EXPECT_EQ(seqs.Append(5, 7, Tokens(8), {}, hidden).value().prefix_hit_tokens, 0);
  ASSERT_TRUE(seqs.Commit(5).ok());
  ASSERT_TRUE(seqs.Release(1).ok());
  ASSERT_TRUE(seqs.Abort(4).ok());
  const SharingScope hidden_too = hidden;
  EXPECT_EQ(seqs.Append(6, 7, Tokens(8), {}, hidden_too).value().prefix_hit_tokens, 0);
  // A sequence keeps its namespace.
  EXPECT_EQ(seqs.Append(5, 7, Tokens(1), {}, red).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(seqs.Append(5, 7, Tokens(1)).ok());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, ForkSharesBlocksAndCopiesThePartialBlockOnWrite) {
  BlockAllocator a(8);
  SequenceTable seqs(&a, 4);
  ASSERT_TRUE(seqs.Append(1, 9, Tokens(6)).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  ASSERT_TRUE(seqs.Fork(1, 2, 7).ok());
  EXPECT_EQ(seqs.Fork(1, 2, 7).code(), absl::StatusCode::kAlreadyExists);
  const std::vector<BlockId> shared = Copy(seqs.Blocks(1));
  EXPECT_EQ(Copy(seqs.Blocks(2)), shared);
  EXPECT_EQ(a.RefCount(shared[1]), 2);
  AppendPlan p = seqs.Append(2, 7, Tokens(1, 500)).value();
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].first, shared[1]);
  EXPECT_EQ(p.slots[0], p.copies[0].second * 4 + 2);
  ASSERT_TRUE(seqs.Commit(2).ok());
  EXPECT_EQ(Copy(seqs.Blocks(1)), shared);  // the original is untouched
  EXPECT_EQ(Copy(seqs.Blocks(2))[0], shared[0]);
  EXPECT_EQ(a.RefCount(shared[1]), 1);
  // The original writes into its own partial block without a copy now.
  EXPECT_TRUE(seqs.Append(1, 9, Tokens(1)).value().copies.empty());
  ASSERT_TRUE(seqs.Commit(1).ok());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(SequenceTableTest, AnExpiredLeaseGivesEveryBlockBack) {
  FakeClock clock;
  LeaseTable leases(&clock, 3'000'000);
  BlockAllocator a(16);
  SequenceTable seqs(&a, 4);
  const LeaseId worker = leases.Grant("prefill-0");
  const LeaseId client = leases.Grant("client");
  ASSERT_TRUE(seqs.Append(1, worker, Tokens(9)).ok());
  ASSERT_TRUE(seqs.Commit(1).ok());
  ASSERT_TRUE(seqs.Append(1, worker, Tokens(6)).ok());  // pending when it dies
  ASSERT_TRUE(seqs.Fork(1, 2, client).code() == absl::StatusCode::kFailedPrecondition);
  clock.Advance(2'000'000);
  ASSERT_TRUE(leases.Renew(client).ok());
  clock.Advance(1'500'000);
  const std::vector<LeaseId> expired = leases.Expire();
  ASSERT_EQ(expired, std::vector<LeaseId>{worker});
  EXPECT_EQ(leases.Renew(worker).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(seqs.ForgetLease(worker), 1);
  EXPECT_GT(a.ReleaseLease(worker), 0);
  EXPECT_EQ(a.counts().reserved + a.counts().used, 0);
  EXPECT_EQ(a.counts().free + a.counts().cached, 16);
  EXPECT_TRUE(a.CheckInvariants().ok());
  EXPECT_TRUE(leases.Alive(client));
}

// Random appends, commits, aborts, forks, releases and lease expiries over a small pool.
TEST(SequenceTableTest, RandomOperationsKeepThePoolConsistent) {
  std::mt19937_64 rng(std::random_device{}());
  BlockAllocator a(24);
  SequenceTable seqs(&a, 4);
  int exhausted = 0, appended = 0, committed = 0, forked = 0;
  for (int op = 0; op < 40000; ++op) {
    const SeqId seq = 1 + rng() % 12;
    const LeaseId lease = 1 + seq % 3;  // each sequence has one owner
    switch (rng() % 7) {
      case 0:
      case 1:
      case 2: {
        std::vector<int32_t> t(1 + rng() % 9);
        for (int32_t& x : t) x = static_cast<int32_t>(rng() % 2);  // few tokens: many prefix hits
        auto p = seqs.Append(seq, lease, t);
        if (p.ok()) ++appended;
        if (!p.ok() && p.status().code() == absl::StatusCode::kResourceExhausted) ++exhausted;
        break;
      }
      case 3:
        committed += seqs.Commit(seq).ok();
        break;
      case 4:
        seqs.Abort(seq).IgnoreError();
        break;
      case 5: {
        const SeqId dst = 1 + rng() % 12;
        forked += seqs.Fork(seq, dst, 1 + dst % 3).ok();
        break;
      }
      default:
        if (rng() % 4 == 0) {
          seqs.ForgetLease(lease);
          a.ReleaseLease(lease);
        } else {
          seqs.Release(seq).IgnoreError();
        }
    }
    ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants() << " after op " << op;
  }
  EXPECT_GT(exhausted, 10);
  EXPECT_GT(appended, 1000);
  EXPECT_GT(committed, 1000);
  EXPECT_GT(forked, 100);
}

TEST(LeaseTableTest, HeartbeatsKeepALeaseAliveAndSilenceEndsIt) {
  FakeClock clock;
  LeaseTable leases(&clock, 1000);
  const LeaseId l = leases.Grant("decode-1");
  EXPECT_EQ(*leases.Holder(l), "decode-1");
  for (int i = 0; i < 5; ++i) {
    clock.Advance(900);
    ASSERT_TRUE(leases.Renew(l).ok());
    EXPECT_TRUE(leases.Expire().empty());
  }
  clock.Advance(1001);
  EXPECT_FALSE(leases.Alive(l));
  EXPECT_EQ(leases.Expire(), std::vector<LeaseId>{l});
  EXPECT_EQ(leases.size(), 0u);
  EXPECT_EQ(leases.Renew(l).code(), absl::StatusCode::kAborted);
  const LeaseId m = leases.Grant("x");
  EXPECT_NE(m, l);
  EXPECT_TRUE(leases.Revoke(m));
  EXPECT_FALSE(leases.Revoke(m));
}

}  // namespace
}  // namespace kvp
