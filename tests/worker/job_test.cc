// A job is checked against the arena before any kernel runs: block ids, slots and positions out of
// range are typed errors, never memory accesses.
#include "worker/job.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/framing.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

JobContext Context() {
  JobContext ctx;
  ctx.spec.num_layers = 2;
  ctx.spec.indexer = true;
  ctx.num_blocks = 10;
  ctx.model.topk = 64;
  return ctx;
}

// A one-step decode job at `position` over `blocks`, writing into `slot`.
absl::StatusOr<DecodeWork> Decode(std::vector<int32_t> blocks, int64_t position, int64_t slot) {
  EnvelopeBuilder b(1);
  auto job = b.envelope().getBody().initDecodeJob();
  auto step = job.initSteps(1)[0];
  step.setSequence(3);
  step.setPosition(position);
  step.setSlot(slot);
  auto table = step.initBlockTable(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) table.set(i, blocks[i]);
  return DecodeWorkFromWire(b.envelope().asReader().getBody().getDecodeJob(), Context());
}

TEST(JobTest, AValidDecodeJobDecodes) {
  absl::StatusOr<DecodeWork> w = Decode({4, 7}, 70, 7 * 64 + 6);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->steps.size(), 1u);
  EXPECT_EQ(w->steps[0].block_table, (std::vector<int32_t>{4, 7}));
  EXPECT_FALSE(w->steps[0].needle.has_value());
}

TEST(JobTest, BlockOutOfRangeIsRefused) {
  absl::Status s = Decode({4, 10}, 70, 4 * 64).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("block 10 is outside the arena's 10 blocks"));
  s = Decode({-1}, 0, 0).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
}

TEST(JobTest, PositionPastTheBlockTableIsRefused) {
  const absl::Status s = Decode({4}, 64, 4 * 64).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
}

TEST(JobTest, SlotOutsideTheArenaOrNotThePositionsIsRefused) {
  absl::Status s = Decode({4}, 3, 10 * 64).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
  s = Decode({4}, 3, 5 * 64 + 3).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(JobTest, PrefillSlotsMustMatchTokens) {
  EnvelopeBuilder b(1);
  auto job = b.envelope().getBody().initPrefillJob();
  job.initTokens(3);
  auto slots = job.initSlotMapping(2);
  slots.set(0, 1);
  slots.set(1, 2);
  const absl::Status s =
      PrefillWorkFromWire(b.envelope().asReader().getBody().getPrefillJob(), Context()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(JobTest, CopiesOutsideTheArenaAreRefused) {
  EnvelopeBuilder b(1);
  auto job = b.envelope().getBody().initPrefillJob();
  auto copy = job.initCopies(1)[0];
  copy.setSource(2);
  copy.setTarget(11);
  const absl::Status s =
      PrefillWorkFromWire(b.envelope().asReader().getBody().getPrefillJob(), Context()).status();
  EXPECT_TRUE(absl::IsOutOfRange(s)) << s;
}

}  // namespace
}  // namespace kvp
