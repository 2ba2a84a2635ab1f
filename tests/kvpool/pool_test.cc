#include "kvpool/pool/pool.h"

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
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pool = Pool::Create(Spec(), 10 * stride + stride / 2, &clock, 1000).value();
  EXPECT_EQ(pool->blocks().num_blocks(), 10);
  EXPECT_EQ(Pool::Create(Spec(), stride - 1, &clock, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  PoolSpec bad = Spec();
  bad.head_dim = 80;
  EXPECT_EQ(Pool::Create(bad, 1 << 30, &clock, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PoolTest, AnExpiredLeaseTakesItsSequencesReservationsAndReferencesWithIt) {
  FakeClock clock;
  const int64_t stride = BlockLayout::Create(Spec()).value().block_stride();
  auto pool = Pool::Create(Spec(), 8 * stride, &clock, 3'000'000).value();
  const LeaseId worker = pool->leases().Grant("prefill-0");
  const LeaseId client = pool->leases().Grant("client-1");
  std::vector<int32_t> tokens(100, 3);
  ASSERT_TRUE(pool->sequences().Append(1, worker, tokens).ok());
  ASSERT_TRUE(pool->sequences().Commit(1).ok());
  ASSERT_TRUE(pool->sequences().Fork(1, 2, client).ok());
  ASSERT_TRUE(pool->sequences().Append(1, worker, tokens).ok());  // in flight when it dies
  clock.Advance(2'000'000);
  ASSERT_TRUE(pool->leases().Renew(client).ok());
  clock.Advance(1'500'000);
  EXPECT_EQ(pool->ReapExpiredLeases(), std::vector<LeaseId>{worker});
  EXPECT_FALSE(pool->sequences().Contains(1));
  EXPECT_TRUE(pool->sequences().Contains(2));  // the fork keeps its shared blocks
  EXPECT_EQ(pool->blocks().counts().reserved, 0);
  EXPECT_EQ(pool->blocks().counts().used, 2);
  EXPECT_TRUE(pool->blocks().CheckInvariants().ok());
  pool->EndLease(client);
  EXPECT_FALSE(pool->sequences().Contains(2));
  EXPECT_EQ(pool->blocks().counts().used, 0);
  EXPECT_EQ(pool->blocks().counts().free + pool->blocks().counts().cached, 8);
  EXPECT_EQ(pool->leases().size(), 0u);
}

}  // namespace
}  // namespace kvp
