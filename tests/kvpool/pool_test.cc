#include "kvpool/pool/pool_set.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

PoolSpec Spec() {
  PoolSpec spec;
  spec.num_layers = 2;
  spec.indexer = true;
  return spec;
}

TEST(PoolTest, HoldsTheBlocksThatFitInTheArena) {
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pool = Pool::Create(Spec(), 10 * stride + stride / 2).value();
  EXPECT_EQ(pool->blocks().num_blocks(), 10);
  EXPECT_EQ(Pool::Create(Spec(), stride - 1).status().code(), absl::StatusCode::kInvalidArgument);
  PoolSpec bad = Spec();
  bad.head_dim = 80;
  EXPECT_EQ(Pool::Create(bad, 1 << 30).status().code(), absl::StatusCode::kInvalidArgument);
  FakeClock clock;
  EXPECT_EQ(PoolSet::Create(Spec(), 1 << 30, 0, &clock, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PoolSet::Create(Spec(), 1 << 30, 2, &clock, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PoolTest, AnExpiredLeaseTakesItsSequencesReservationsAndReferencesWithIt) {
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 8 * stride, 1, &clock, 3'000'000).value();
  Pool* pool = &pools->pool(0);
  const LeaseId worker = pools->leases().Grant("prefill-0");
  const LeaseId client = pools->leases().Grant("client-1");
  std::vector<int32_t> tokens(100, 3);
  ASSERT_TRUE(pool->sequences().Append(1, worker, tokens).ok());
  ASSERT_TRUE(pool->sequences().Commit(1).ok());
  ASSERT_TRUE(pool->sequences().Fork(1, 2, client).ok());
  ASSERT_TRUE(pool->sequences().Append(1, worker, tokens).ok());  // in flight when it dies
  clock.Advance(2'000'000);
  ASSERT_TRUE(pools->leases().Renew(client).ok());
  clock.Advance(1'500'000);
  const std::vector<LeaseId> expired = pools->leases().Expire();
  EXPECT_EQ(expired, std::vector<LeaseId>{worker});
  for (LeaseId lease : expired) pools->ForgetLease(lease);
  EXPECT_FALSE(pool->sequences().Contains(1));
  EXPECT_TRUE(pool->sequences().Contains(2));  // the fork keeps its shared blocks
  EXPECT_EQ(pool->blocks().counts().reserved, 0);
  EXPECT_EQ(pool->blocks().counts().used, 2);
  EXPECT_TRUE(pool->blocks().CheckInvariants().ok());
  pools->leases().Revoke(client);
  pools->ForgetLease(client);
  EXPECT_FALSE(pool->sequences().Contains(2));
  EXPECT_EQ(pool->blocks().counts().used, 0);
  EXPECT_EQ(pool->blocks().counts().free + pool->blocks().counts().cached, 8);
  EXPECT_EQ(pools->leases().size(), 0u);
  EXPECT_TRUE(pools->CheckInvariants().ok());
}

// A migration's bookkeeping: imported into another pool, a sequence is found there by its blocks'
// prefix keys, committed with the source's state, and the source's blocks stay as its cache.
TEST(PoolTest, AnImportedSequenceMatchesItsSourceAndHasOneHome) {
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 16 * stride, 2, &clock, 3'000'000).value();
  SequenceTable& source = pools->pool(0).sequences();
  SequenceTable& target = pools->pool(1).sequences();
  const LeaseId client = pools->leases().Grant("client");
  std::vector<int32_t> tokens(150);  // two full blocks of 64 and a partial one
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 3 + 1);
  ASSERT_TRUE(source.Append(7, client, tokens).ok());
  ASSERT_TRUE(source.Commit(7).ok());
  EXPECT_EQ(pools->Home(7), 0u);

  SequenceImage image = source.Image(7).value();
  ASSERT_EQ(image.blocks.size(), 3u);
  EXPECT_TRUE(image.keys[0].has_value() && image.keys[1].has_value());
  EXPECT_FALSE(image.keys[2].has_value());  // the partial block is not indexed
  const std::vector<BlockMove> moves = target.Import(7, client, image).value();
  EXPECT_EQ(moves.size(), 3u);
  EXPECT_TRUE(target.Importing(7));
  EXPECT_EQ(pools->Home(7), 0u);  // until it commits
  EXPECT_EQ(target.Import(7, client, image).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(source.Image(7).value().length, 150);
  ASSERT_TRUE(pools->CheckInvariants().ok());

  // Aborted: nothing is left in the target.
  ASSERT_TRUE(target.Abort(7).ok());
  EXPECT_FALSE(target.Contains(7));
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 0);
  ASSERT_TRUE(pools->CheckInvariants().ok());

  // Committed: the target has the source's state; the source lets go, keeping its cache.
  ASSERT_EQ(target.Import(7, client, image).value().size(), 3u);
  ASSERT_TRUE(target.Commit(7).ok());
  ASSERT_TRUE(source.Release(7).ok());
  EXPECT_EQ(pools->Home(7), 1u);
  EXPECT_EQ(target.Length(7).value(), 150);
  EXPECT_EQ(pools->pool(0).blocks().counts().cached, 2);
  ASSERT_TRUE(pools->CheckInvariants().ok());
  // The target indexed the full blocks under the source's keys: the same prompt hits them.
  AppendPlan again = target.Append(10, client, tokens).value();
  EXPECT_EQ(again.prefix_hit_tokens, 128);
  ASSERT_TRUE(target.Abort(10).ok());

  // Moving it back finds the source's cached blocks: only the partial one is copied.
  SequenceImage back = target.Image(7).value();
  const std::vector<BlockMove> copies = source.Import(7, client, back).value();
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].source, back.blocks[2]);
  ASSERT_TRUE(source.Commit(7).ok());
  ASSERT_TRUE(target.Release(7).ok());
  EXPECT_EQ(pools->Home(7), 0u);
  EXPECT_EQ(pools->HeldBy(client), 3);
  ASSERT_TRUE(pools->CheckInvariants().ok());
}

TEST(PoolTest, AnImportThatDoesNotFitChangesNothing) {
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 4 * stride, 2, &clock, 3'000'000).value();
  const LeaseId client = pools->leases().Grant("client");
  ASSERT_TRUE(pools->pool(0).sequences().Append(1, client, std::vector<int32_t>(200, 5)).ok());
  ASSERT_TRUE(pools->pool(0).sequences().Commit(1).ok());
  ASSERT_TRUE(pools->pool(1).sequences().Append(2, client, std::vector<int32_t>(64, 9)).ok());
  ASSERT_TRUE(pools->pool(1).sequences().Commit(2).ok());
  const SequenceImage image = pools->pool(0).sequences().Image(1).value();
  EXPECT_EQ(pools->pool(1).sequences().Import(1, client, image).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(pools->pool(1).sequences().Contains(1));
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 0);
  ASSERT_TRUE(pools->CheckInvariants().ok());
}

// A sliced prefill's stream: blocks staged on the decode pool while the prefill is written are
// taken by the import, those it does not need go back, and nothing staged outlives its lease.
TEST(PoolTest, StagedBlocksAreTakenByTheImportOrGivenBack) {
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pools = PoolSet::Create(Spec(), 8 * stride, 2, &clock, 3'000'000).value();
  SequenceTable& source = pools->pool(0).sequences();
  SequenceTable& target = pools->pool(1).sequences();
  const LeaseId client = pools->leases().Grant("client");
  const LeaseId other = pools->leases().Grant("other");
  std::vector<int32_t> tokens(200);  // three full blocks of 64 and a partial one
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 11);
  ASSERT_TRUE(source.Append(7, client, tokens).ok());
  const std::vector<BlockId> table(source.Blocks(7).value().begin(),
                                   source.Blocks(7).value().end());

  // Staged while the append is pending: one block each, a block staged twice only once.
  const std::vector<BlockMove> first = target.Stage(7, client, {table[0], table[1]}).value();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].source, table[0]);
  EXPECT_EQ(target.Stage(7, client, {table[1], table[2]}).value().size(), 1u);
  EXPECT_EQ(target.StagedBlocks(7), 3u);
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 3);
  EXPECT_EQ(target.Stage(7, other, {table[3]}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::vector<BlockMove> last =
      target.Stage(7, client, std::vector<BlockId>(5, table[3])).value();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(target.Stage(8, client, {0, 1, 2, 3, 4}).status().code(),
            absl::StatusCode::kResourceExhausted) << "4 of 8 are staged";
  EXPECT_EQ(target.StagedBlocks(8), 0u);
  ASSERT_TRUE(pools->CheckInvariants().ok());
  // A copy that failed gives its block back; a move naming another target changes nothing.
  target.Unstage(7, {{.source = table[3], .target = last[0].target + 1}});
  EXPECT_EQ(target.StagedBlocks(7), 4u);
  target.Unstage(7, last);
  EXPECT_EQ(target.StagedBlocks(7), 3u);
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 3);
  ASSERT_TRUE(pools->CheckInvariants().ok());

  // The import takes the staged copies of blocks 0 to 2; block 3 (the partial one) is copied.
  ASSERT_TRUE(source.Commit(7).ok());
  const SequenceImage image = source.Image(7).value();
  ASSERT_EQ(image.blocks.size(), 4u);
  size_t taken = 0;
  const std::vector<BlockMove> moves = target.Import(7, client, image, &taken).value();
  EXPECT_EQ(taken, 3u);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].source, table[3]);
  EXPECT_EQ(target.StagedBlocks(7), 0u);
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 4);
  ASSERT_TRUE(pools->CheckInvariants().ok());
  ASSERT_TRUE(target.Commit(7).ok());
  ASSERT_TRUE(source.Release(7).ok());
  EXPECT_EQ(target.Length(7).value(), 200);
  EXPECT_EQ(pools->pool(1).blocks().counts().used, 4);
  ASSERT_TRUE(pools->CheckInvariants().ok());

  // Staged blocks the import does not need (the destination holds the prefix) go back to free,
  // and a lease's end takes its staged blocks with it.
  ASSERT_TRUE(source.Append(9, client, tokens).ok());
  ASSERT_TRUE(source.Commit(9).ok());  // prefix hits of 7's cached blocks
  const SequenceImage nine = source.Image(9).value();
  ASSERT_TRUE(target.Release(7).ok());  // its full blocks stay cached on pool 1
  ASSERT_EQ(target.Stage(9, client, {nine.blocks[0], nine.blocks[3]}).value().size(), 2u);
  const std::vector<BlockMove> rest = target.Import(9, client, nine, &taken).value();
  EXPECT_EQ(taken, 1u) << "block 0 is a hit there; only the partial block's copy is taken";
  EXPECT_TRUE(rest.empty());
  ASSERT_TRUE(target.Abort(9).ok());
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 0);
  ASSERT_TRUE(target.Stage(9, client, {nine.blocks[1]}).ok());
  pools->leases().Revoke(client);
  pools->ForgetLease(client);
  EXPECT_EQ(target.StagedBlocks(9), 0u);
  EXPECT_EQ(pools->pool(1).blocks().counts().reserved, 0);
  ASSERT_TRUE(pools->CheckInvariants().ok());
}

TEST(PoolTest, AnMlaPoolKeepsItsSlotsInt32) {
  const PoolSpec spec = MlaPoolSpec(/*num_layers=*/1, /*block_size=*/16, /*indexer_ue8m0=*/true);
  const uint64_t stride = static_cast<uint64_t>(BlockLayout::Create(spec)->block_stride());
  const uint64_t slot_limit_blocks = uint64_t{INT32_MAX} / 16;
  EXPECT_EQ(Pool::Create(spec, stride * (slot_limit_blocks + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Pool::Create(spec, stride * 1000).ok());
}

}  // namespace
}  // namespace kvp
