// A job is checked against the arena before any kernel runs: block ids, slots and positions out of
// range are typed errors, never memory accesses.
#include "worker/job.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/block_tables.h"
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

// A one-step decode job for sequence 3 at `position`, writing into `slot`, whose block table is
// the first `from` blocks the worker holds, then `tail`; `full` is what it should add up to.
absl::StatusOr<DecodeWork> Decode(BlockTableCache& held, uint32_t from, std::vector<int32_t> tail,
                                  const std::vector<int32_t>& full, int64_t position,
                                  int64_t slot) {
  EnvelopeBuilder b(1);
  auto job = b.envelope().getBody().initDecodeJob();
  auto step = job.initSteps(1)[0];
  step.setSequence(3);
  step.setPosition(position);
  step.setSlot(slot);
  step.setBlockTableFrom(from);
  step.setBlockTableHash(BlockTableHash(full));
  auto table = step.initBlockTable(tail.size());
  for (size_t i = 0; i < tail.size(); ++i) table.set(i, tail[i]);
  return DecodeWorkFromWire(b.envelope().asReader().getBody().getDecodeJob(), Context(), held);
}

// The same with the whole table sent.
absl::StatusOr<DecodeWork> Decode(std::vector<int32_t> blocks, int64_t position, int64_t slot) {
  BlockTableCache held;
  return Decode(held, 0, blocks, blocks, position, slot);
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

TEST(JobTest, BlockTablesAreRebuiltFromWhatTheWorkerHolds) {
  BlockTableCache held;
  ASSERT_TRUE(Decode(held, 0, {4, 7}, {4, 7}, 70, 7 * 64 + 6).ok());
  EXPECT_THAT(held[3].blocks(), ::testing::ElementsAre(4, 7));
  // The next steps send only the new block; a copy-on-write replaces the last one.
  absl::StatusOr<DecodeWork> w = Decode(held, 2, {9}, {4, 7, 9}, 128, 9 * 64);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->steps[0].block_table, (std::vector<int32_t>{4, 7, 9}));
  w = Decode(held, 2, {5}, {4, 7, 5}, 129, 5 * 64 + 1);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(held[3].blocks(), ::testing::ElementsAre(4, 7, 5));
}

TEST(JobTest, ATableThatCannotBeRebuiltIsAborted) {
  BlockTableCache held;
  ASSERT_TRUE(Decode(held, 0, {4, 7}, {4, 7}, 70, 7 * 64 + 6).ok());
  absl::Status s = Decode(held, 3, {9}, {4, 7, 1, 9}, 200, 9 * 64 + 8).status();
  EXPECT_TRUE(absl::IsAborted(s)) << s;  // holds 2 blocks, not 3
  s = Decode(held, 1, {6}, {4, 7}, 70, 7 * 64 + 6).status();
  EXPECT_TRUE(absl::IsAborted(s)) << s;  // {4, 6} is not the table kvpoold meant
}

TEST(JobTest, ForgottenSequencesAreDropped) {
  BlockTableCache held;
  ASSERT_TRUE(Decode(held, 0, {4}, {4}, 3, 4 * 64 + 3).ok());
  EnvelopeBuilder b(1);
  auto job = b.envelope().getBody().initDecodeJob();
  job.initForget(1).set(0, 3);
  ASSERT_TRUE(
      DecodeWorkFromWire(b.envelope().asReader().getBody().getDecodeJob(), Context(), held).ok());
  EXPECT_FALSE(held.contains(3));
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
