// The Broker's sliced and continued prefills: each slice's full blocks stream to the decode pool
// while the next is written, the last move takes what is left, and failures leave nothing behind.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/broker_test_fixture.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

class BrokerStreamTest : public BrokerPoolsTest {
 protected:
  using Sent = std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>>;
  // 400 tokens of `seq` (six full blocks of 64 and a partial one) on pool 0, decoded on pool 1,
  // in slices of 128 tokens (two blocks).
  Sent StartSliced(uint64_t id, uint64_t seq) {
    EnvelopeBuilder m = Prefill(id, seq, 400);
    auto p = m.envelope().getBody().getPrefill();
    p.setPool(0);
    p.setDecodePool(1);
    p.setChunkTokens(128);
    return Send("c", m);
  }
  // The one message of `sent` to `worker` of the kind `is` checks.
  template <typename Is>
  static const ParsedEnvelope* To(const Sent& sent, const std::string& worker, Is is) {
    const ParsedEnvelope* found = nullptr;
    for (const auto& [to, e] : sent) {
      if (to != worker || !is(e->envelope().getBody())) continue;
      EXPECT_EQ(found, nullptr) << "two such messages to " << worker;
      found = e.get();
    }
    return found;
  }
  static const ParsedEnvelope* SliceTo(const Sent& sent, const std::string& worker) {
    return To(sent, worker, [](auto body) { return body.isPrefillJob(); });
  }
  static const ParsedEnvelope* MoveTo(const Sent& sent, const std::string& worker) {
    return To(sent, worker, [](auto body) { return body.isMigrateJob(); });
  }
  static uint64_t JobOf(const ParsedEnvelope* e) {
    const auto body = e->envelope().getBody();
    return body.isPrefillJob() ? body.getPrefillJob().getJob() : body.getMigrateJob().getJob();
  }
  static EnvelopeBuilder Failed(uint64_t job) {
    EnvelopeBuilder m(job);
    auto f = m.envelope().getBody().initJobFailed();
    f.setJob(job);
    StatusToWire(absl::InternalError("injected"), f.initError());
    return m;
  }
};

TEST_F(BrokerStreamTest, SlicesStreamTheirFullBlocksAndTheFinalMoveTakesThem) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = StartSliced(7, 1);
  const ParsedEnvelope* slice = SliceTo(sent, "p0");
  ASSERT_NE(slice, nullptr);
  auto pj = slice->envelope().getBody().getPrefillJob();
  EXPECT_EQ(pj.getTokens().size(), 128u);
  EXPECT_EQ(pj.getFirstPosition(), 0u);
  EXPECT_EQ(pj.getSlotMapping().size(), 128u);
  EXPECT_EQ(Counts(0).reserved, 7) << "the whole prefill is planned at once";

  // Slice 1 done: slice 2 goes out and blocks 0 and 1 are staged and streamed to pool 1.
  sent = Send("p0", Done(JobOf(slice)));
  slice = SliceTo(sent, "p0");
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(slice, nullptr);
  ASSERT_NE(move, nullptr);
  pj = slice->envelope().getBody().getPrefillJob();
  EXPECT_EQ(pj.getFirstPosition(), 128u);
  EXPECT_EQ(pj.getTokens()[0], 129) << "tokens are i + 1";
  EXPECT_EQ(pj.getCopies().size(), 0u);
  auto mj = move->envelope().getBody().getMigrateJob();
  EXPECT_EQ(mj.getSequence(), 1u);
  EXPECT_EQ(mj.getTransport(), wire::Transport::HOST);
  ASSERT_EQ(mj.getMoves().size(), 2u);
  const absl::Span<const BlockId> table = pools_->pool(0).sequences().Blocks(1).value();
  EXPECT_EQ(mj.getMoves()[0].getSource(), table[0]);
  EXPECT_EQ(mj.getMoves()[1].getSource(), table[1]);
  EXPECT_EQ(Counts(1).reserved, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(StatusOf(*Send("c", Migrate(8, 1, 1)).at(0).second)))
      << "busy while it is written";
  const uint64_t first_move = JobOf(move);  // `sent`, which holds it, is reused below

  // Slice 2 done while the stream move runs: no second move until it ends.
  sent = Send("p0", Done(JobOf(slice)));
  slice = SliceTo(sent, "p0");
  ASSERT_NE(slice, nullptr);
  const uint64_t third_slice = JobOf(slice);  // `sent` is reused below
  EXPECT_EQ(MoveTo(sent, "d1"), nullptr);
  EnvelopeBuilder streamed = Done(first_move);
  streamed.envelope().getBody().getJobDone().setBytes(1000);
  sent = Send("d1", streamed);
  move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr) << "blocks 2 and 3, full since slice 2";
  ASSERT_EQ(move->envelope().getBody().getMigrateJob().getMoves().size(), 2u);
  const uint64_t second_move = JobOf(move);  // `sent` is reused below
  EXPECT_EQ(Counts(1).reserved, 4);

  // Slices 3 and 4 (16 tokens) done; the end waits for the stream move in flight.
  sent = Send("p0", Done(third_slice));
  slice = SliceTo(sent, "p0");
  ASSERT_NE(slice, nullptr);
  EXPECT_EQ(slice->envelope().getBody().getPrefillJob().getTokens().size(), 16u);
  EXPECT_TRUE(Send("p0", Done(JobOf(slice))).empty()) << "parked until its stream move ends";
  streamed = Done(second_move);
  streamed.envelope().getBody().getJobDone().setBytes(1000);
  sent = Send("d1", streamed);
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  ASSERT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 3u)
      << "blocks 4 to 6: the four streamed ones are taken";
  EXPECT_EQ(Counts(1).reserved, 7);

  EnvelopeBuilder done = Done(JobOf(final_move));
  done.envelope().getBody().getJobDone().setBytes(500);
  sent = Send("d1", done);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "c");
  const auto p = sent[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 1u);
  EXPECT_EQ(p.getLength(), 400u);
  const auto m = p.getMigration();
  EXPECT_FALSE(m.hasError());
  EXPECT_EQ(m.getBlocksMoved(), 7u);
  EXPECT_EQ(m.getStreamedBlocks(), 4u);
  EXPECT_EQ(m.getBlocksShared(), 0u);
  EXPECT_EQ(m.getBytes(), 2500u);
  EXPECT_EQ(Counts(1).used, 7);
  EXPECT_EQ(Counts(1).reserved, 0);
  EXPECT_EQ(Counts(0).used, 0);
  EXPECT_EQ(Counts(0).cached, 6) << "the source keeps its full blocks as prefix cache";
  EXPECT_THAT(broker_->MetricsText(), HasSubstr("kvpool_migration_streamed_blocks_total 4"));
}

TEST_F(BrokerStreamTest, AFailedStreamMoveLeavesItsBlocksToTheFinalMove) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = StartSliced(7, 1);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* slice = SliceTo(sent, "p0");
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  EXPECT_TRUE(Send("d1", Failed(JobOf(move))).empty()) << "no reply: the prefill goes on";
  EXPECT_EQ(Counts(1).reserved, 0) << "its staged blocks are given back";
  for (int i = 0; i < 2; ++i) {  // the stream stopped: slices 2 and 3 go on alone
    sent = Send("p0", Done(JobOf(slice)));
    EXPECT_EQ(MoveTo(sent, "d1"), nullptr);
    slice = SliceTo(sent, "p0");
    ASSERT_NE(slice, nullptr);
  }
  sent = Send("p0", Done(JobOf(slice)));
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  EXPECT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 7u);
  sent = Send("d1", Done(JobOf(final_move)));
  ASSERT_EQ(sent.size(), 1u);
  const auto m = sent[0].second->envelope().getBody().getPrefillReply().getMigration();
  EXPECT_FALSE(m.hasError());
  EXPECT_EQ(m.getBlocksMoved(), 7u);
  EXPECT_EQ(m.getStreamedBlocks(), 0u);
  EXPECT_EQ(Counts(1).used, 7);
}

TEST_F(BrokerStreamTest, AFailedSliceWaitsForItsStreamMoveAndThenLeavesNothing) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = StartSliced(7, 1);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* slice = SliceTo(sent, "p0");
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  EXPECT_TRUE(Send("p0", Failed(JobOf(slice))).empty())
      << "the end waits: d1 still writes the staged blocks";
  EXPECT_EQ(Counts(1).reserved, 2);
  sent = Send("d1", Done(JobOf(move)));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "c");
  EXPECT_EQ(StatusOf(*sent[0].second).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(Counts(0).reserved + Counts(0).used, 0);
  EXPECT_EQ(Counts(1).reserved + Counts(1).used, 0);
  EXPECT_FALSE(pools_->Home(1).has_value());
}

TEST_F(BrokerStreamTest, AClientThatGoesAwayGetsItsBlocksBackOnceBothJobsEnd) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = StartSliced(7, 1);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* slice = SliceTo(sent, "p0");
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  for (int i = 0; i < 12; ++i) {  // the client's lease runs out; the workers' do not
    clock_.Advance(kClientLease / 10);
    Heartbeat("p0");
    Heartbeat("d1");
  }
  EXPECT_TRUE(Tick().empty());
  EXPECT_EQ(Counts(0).reserved, 7) << "slice 2 still writes them";
  EXPECT_EQ(Counts(1).reserved, 2) << "the stream move still writes them";
  EXPECT_TRUE(Send("p0", Done(JobOf(slice))).empty()) << "no next slice for nobody";
  EXPECT_EQ(Counts(1).reserved, 2);
  EXPECT_TRUE(Send("d1", Done(JobOf(move))).empty());
  EXPECT_EQ(Counts(0).reserved + Counts(0).used, 0);
  EXPECT_EQ(Counts(1).reserved + Counts(1).used, 0);
}

TEST_F(BrokerStreamTest, AStreamMoveStillQueuedAtTheLastSliceIsLeftToTheFinalMove) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  // Pool 1's only worker is busy receiving another sequence the whole time (in another
  // namespace: no prefix hit for sequence 1).
  EnvelopeBuilder other_prefill = Prefill(5, 9, 100);
  other_prefill.envelope().getBody().getPrefill().setPool(0);
  other_prefill.envelope().getBody().getPrefill().setCacheNamespace("other");
  Sent written = Send("c", other_prefill);
  ASSERT_NE(SliceTo(written, "p0"), nullptr);
  ASSERT_EQ(Send("p0", Done(JobOf(SliceTo(written, "p0")))).size(), 1u);
  Sent busy = Send("c", Migrate(6, 9, 1));
  const ParsedEnvelope* other = MoveTo(busy, "d1");
  ASSERT_NE(other, nullptr);
  Sent sent = StartSliced(7, 1);
  const ParsedEnvelope* slice = SliceTo(sent, "p0");
  for (int i = 0; i < 3; ++i) {  // slices 1 to 3
    sent = Send("p0", Done(JobOf(slice)));
    EXPECT_EQ(MoveTo(sent, "d1"), nullptr);
    slice = SliceTo(sent, "p0");
    ASSERT_NE(slice, nullptr);
  }
  EXPECT_EQ(Counts(1).reserved, 2 + 2) << "sequence 9's two blocks, and the queued stream's";
  sent = Send("p0", Done(JobOf(slice)));
  EXPECT_TRUE(sent.empty()) << "the final move waits for d1 too";
  EXPECT_EQ(Counts(1).reserved, 2 + 7) << "the stream's blocks went back, the final move's came";
  sent = Send("d1", Done(JobOf(other)));
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  EXPECT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 7u);
  sent = Send("d1", Done(JobOf(final_move)));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].second->envelope().getBody().getPrefillReply().getMigration()
                .getStreamedBlocks(), 0u);
  EXPECT_EQ(Counts(1).used, 2 + 7);
}

TEST_F(BrokerStreamTest, ShortPrefillsAndChunkTokensZeroAreWrittenWhole) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  EnvelopeBuilder m = Prefill(7, 1, 400);
  auto p = m.envelope().getBody().getPrefill();
  p.setPool(0);
  p.setDecodePool(1);
  p.setChunkTokens(0);
  Sent sent = Send("c", m);
  ASSERT_NE(SliceTo(sent, "p0"), nullptr);
  EXPECT_EQ(SliceTo(sent, "p0")->envelope().getBody().getPrefillJob().getTokens().size(), 400u);
  p.setSequence(2);
  p.setChunkTokens(-2);
  EXPECT_EQ(StatusOf(*Send("c", m).at(0).second).code(), absl::StatusCode::kInvalidArgument);
  p.setChunkTokens(400);  // no more tokens than a slice
  sent = Send("c", m);
  ASSERT_EQ(sent.size(), 0u) << "queued behind sequence 1's prefill";
}

// An engine's chunked prefill: continued prefills stream their full blocks while the engine
// computes the next chunk; the last one moves only what is left.
class BrokerContinuedTest : public BrokerStreamTest {
 protected:
  // `tokens` more tokens of sequence 1 on pool 0 for decode pool 1, continued or the last.
  Sent Chunk(uint64_t id, int tokens, bool continued) {
    EnvelopeBuilder m = Prefill(id, 1, tokens);
    auto p = m.envelope().getBody().getPrefill();
    p.setPool(0);
    p.setDecodePool(1);
    p.setContinued(continued);
    return Send("c", m);
  }
};

TEST_F(BrokerContinuedTest, ContinuedPrefillsStreamAndTheLastMovesWhatIsLeft) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  // Chunk 1 (two blocks): written, answered at once, its blocks streamed.
  Sent sent = Chunk(7, 128, true);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  EXPECT_EQ(move->envelope().getBody().getMigrateJob().getMoves().size(), 2u);
  const uint64_t first_move = JobOf(move);
  ASSERT_EQ(sent.size(), 2u);
  const auto reply = sent[0].first == "c" ? sent[0].second->envelope().getBody()
                                          : sent[1].second->envelope().getBody();
  ASSERT_TRUE(reply.isPrefillReply());
  EXPECT_EQ(reply.getPrefillReply().getPool(), 0u) << "it lives on pool 0 until the last chunk";
  EXPECT_FALSE(reply.getPrefillReply().hasMigration());
  EXPECT_EQ(Counts(1).reserved, 2);
  // Chunk 2 is written while the stream move runs (the move holds no sequence busy).
  sent = Chunk(8, 128, true);
  ASSERT_NE(SliceTo(sent, "p0"), nullptr);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  ASSERT_EQ(sent.size(), 1u) << "the reply; one stream move at a time";
  EXPECT_TRUE(sent[0].second->envelope().getBody().isPrefillReply());
  sent = Send("d1", Done(first_move));
  move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr) << "chunk 2's blocks";
  EXPECT_EQ(move->envelope().getBody().getMigrateJob().getMoves().size(), 2u);
  const uint64_t second_move = JobOf(move);
  // The last chunk: written, then parked behind the stream move, then the rest moves.
  sent = Chunk(9, 100, false);
  EXPECT_TRUE(Send("p0", Done(JobOf(SliceTo(sent, "p0")))).empty());
  EnvelopeBuilder streamed = Done(second_move);
  streamed.envelope().getBody().getJobDone().setBytes(1000);
  sent = Send("d1", streamed);
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  EXPECT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 2u)
      << "356 tokens are six blocks; four streamed";
  sent = Send("d1", Done(JobOf(final_move)));
  ASSERT_EQ(sent.size(), 1u);
  const auto p = sent[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 1u);
  EXPECT_EQ(p.getLength(), 356u);
  EXPECT_EQ(p.getMigration().getBlocksMoved(), 6u);
  EXPECT_EQ(p.getMigration().getStreamedBlocks(), 4u);
  EXPECT_FALSE(p.getMigration().hasError());
  EXPECT_EQ(Counts(1).used, 6);
  EXPECT_EQ(Counts(1).reserved, 0);
  EXPECT_EQ(Counts(0).used, 0);
}

TEST_F(BrokerContinuedTest, AStreamingSequenceKeepsItsDecodePoolAndReleasesSafely) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = Chunk(7, 128, true);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  const uint64_t moving = JobOf(move);
  // Its later prefills name the same decode pool; it does not migrate while blocks move.
  EnvelopeBuilder elsewhere = Prefill(8, 1, 10);
  elsewhere.envelope().getBody().getPrefill().setPool(0);
  const absl::Status refused = StatusOf(*Send("c", elsewhere).at(0).second);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("streams to pool 1"));
  const absl::Status busy = StatusOf(*Send("c", Migrate(9, 1, 1)).at(0).second);
  EXPECT_TRUE(absl::IsFailedPrecondition(busy)) << busy;
  EXPECT_TRUE(Send("other", elsewhere).at(0).second->envelope().getBody().isError());
  // Released while its blocks move: the staged blocks go only once the move ends.
  EnvelopeBuilder release(10);
  release.envelope().getBody().initRelease().setSequence(1);
  ASSERT_TRUE(Send("c", release).at(0).second->envelope().getBody().isReleaseReply());
  EXPECT_EQ(Counts(1).reserved, 2) << "d1 still writes them";
  EXPECT_TRUE(Send("d1", Done(moving)).empty());
  EXPECT_EQ(Counts(1).reserved, 0);
  // A new sequence of that id streams afresh; its prompt is all prefix hits on pool 0 (the cache
  // the release left): answered at once, its blocks streamed.
  sent = Chunk(11, 128, true);
  ASSERT_EQ(SliceTo(sent, "p0"), nullptr);
  move = MoveTo(sent, "d1");
  ASSERT_NE(move, nullptr);
  EXPECT_EQ(move->envelope().getBody().getMigrateJob().getMoves().size(), 2u);
  EXPECT_TRUE(Send("d1", Done(JobOf(move))).empty());
  ASSERT_TRUE(Send("c", release).at(0).second->envelope().getBody().isReleaseReply());
  EXPECT_EQ(Counts(1).reserved, 0);
}

TEST_F(BrokerContinuedTest, ANewSequenceOfAReleasedIdWaitsForTheOldMoveAndCopiesItAll) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = Chunk(7, 128, true);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const uint64_t old_move = JobOf(MoveTo(sent, "d1"));
  EnvelopeBuilder release(8);
  release.envelope().getBody().initRelease().setSequence(1);
  ASSERT_TRUE(Send("c", release).at(0).second->envelope().getBody().isReleaseReply());
  // The id again, other tokens, decoded on pool 1: its end waits for the old life's move, and
  // none of that life's staged blocks is taken.
  EnvelopeBuilder again = Prefill(9, 1, 200);
  auto p = again.envelope().getBody().getPrefill();
  p.setPool(0);
  p.setDecodePool(1);
  p.setCacheNamespace("new");
  sent = Send("c", again);
  EXPECT_TRUE(Send("p0", Done(JobOf(SliceTo(sent, "p0")))).empty()) << "parked";
  sent = Send("d1", Done(old_move));
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  EXPECT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 4u);
  sent = Send("d1", Done(JobOf(final_move)));
  ASSERT_EQ(sent.size(), 1u);
  const auto m = sent[0].second->envelope().getBody().getPrefillReply().getMigration();
  EXPECT_FALSE(m.hasError());
  EXPECT_EQ(m.getStreamedBlocks(), 0u);
  EXPECT_EQ(Counts(1).used, 4);
  EXPECT_EQ(Counts(1).reserved, 0);
}

TEST_F(BrokerContinuedTest, AFailedChunkDropsWhatStreamedAndTheLastMovesEverything) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  Sent sent = Chunk(7, 128, true);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const uint64_t moving = JobOf(MoveTo(sent, "d1"));
  sent = Chunk(8, 128, true);
  Send("p0", Failed(JobOf(SliceTo(sent, "p0"))));  // an error reply; the stream is dropped
  EXPECT_EQ(Counts(1).reserved, 2) << "until the move in flight ends";
  EXPECT_TRUE(Send("d1", Done(moving)).empty());
  EXPECT_EQ(Counts(1).reserved, 0);
  sent = Chunk(9, 100, false);
  sent = Send("p0", Done(JobOf(SliceTo(sent, "p0"))));
  const ParsedEnvelope* final_move = MoveTo(sent, "d1");
  ASSERT_NE(final_move, nullptr);
  EXPECT_EQ(final_move->envelope().getBody().getMigrateJob().getMoves().size(), 4u)
      << "228 tokens, all moved at the end";
  sent = Send("d1", Done(JobOf(final_move)));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].second->envelope().getBody().getPrefillReply().getMigration()
                .getStreamedBlocks(), 0u);
}

}  // namespace
}  // namespace kvp
