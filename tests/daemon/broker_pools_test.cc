// The Broker over two pools: prefills decoded on the other pool move before their reply, failed
// moves leave the sequence where it was, migrations, typed errors, per-pool Health and stats.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/broker_test_fixture.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

TEST_F(BrokerPoolsTest, APrefillDecodedElsewhereMovesBeforeItsReply) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  auto sent = PrefillOnPool0(7, 1, 1);
  // Written on pool 0; the move is a job of pool 1's worker, and the client waits.
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "d1");
  ASSERT_TRUE(sent[0].second->envelope().getBody().isMigrateJob());
  const auto job = sent[0].second->envelope().getBody().getMigrateJob();
  EXPECT_EQ(job.getSourcePool(), 0u);
  EXPECT_EQ(std::string(job.getSourceChannel().cStr()), "/run/test/fd-0");
  EXPECT_EQ(job.getTransport(), wire::Transport::HOST);
  ASSERT_EQ(job.getMoves().size(), 2u);
  EXPECT_EQ(Counts(0).used, 2);
  EXPECT_EQ(Counts(1).reserved, 2);
  EXPECT_EQ(StatusOf(*Send("c", Migrate(8, 1, 0)).at(0).second).code(),
            absl::StatusCode::kFailedPrecondition) << "busy while it moves";
  EnvelopeBuilder done = Done(job.getJob());
  done.envelope().getBody().getJobDone().setBytes(12345);
  auto replies = Send("d1", done);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].first, "c");
  ASSERT_TRUE(replies[0].second->envelope().getBody().isPrefillReply());
  const auto p = replies[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 1u);
  EXPECT_EQ(p.getLength(), 100u);
  ASSERT_TRUE(p.hasMigration());
  EXPECT_EQ(p.getMigration().getFromPool(), 0u);
  EXPECT_EQ(p.getMigration().getToPool(), 1u);
  EXPECT_EQ(p.getMigration().getBlocksMoved(), 2u);
  EXPECT_EQ(p.getMigration().getBytes(), 12345u);
  EXPECT_FALSE(p.getMigration().hasError());
  // Committed on pool 1; pool 0 keeps its full block as prefix cache, the partial one is free.
  EXPECT_EQ(Counts(1).used, 2);
  EXPECT_EQ(Counts(1).reserved, 0);
  EXPECT_EQ(Counts(0).used, 0);
  EXPECT_EQ(Counts(0).cached, 1);
  // Decodes go to pool 1's worker.
  EnvelopeBuilder d(9);
  auto step = d.envelope().getBody().initDecode().initSteps(1)[0];
  step.setSequence(1);
  auto decoded = Send("c", d);
  ASSERT_EQ(decoded.size(), 1u);
  EXPECT_EQ(decoded[0].first, "d1");
  EXPECT_TRUE(decoded[0].second->envelope().getBody().isDecodeJob());
}

TEST_F(BrokerPoolsTest, AFailedMoveLeavesTheSequenceWhereItWasAndSaysSo) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d0", wire::Role::DECODE, 0);
  Register("d1", wire::Role::DECODE, 1);
  auto sent = PrefillOnPool0(7, 1, 1);
  ASSERT_EQ(sent.size(), 1u);
  const uint64_t job = sent[0].second->envelope().getBody().getMigrateJob().getJob();
  // The receiver dies mid-transfer with no other worker on pool 1: the move aborts.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(kWorkerLease / 2);
    Heartbeat("p0");
    Heartbeat("d0");
  }
  auto replies = Tick();
  ASSERT_EQ(replies.size(), 1u);
  const auto p = replies[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 0u) << "still on the source";
  ASSERT_TRUE(p.getMigration().hasError());
  EXPECT_EQ(StatusFromWire(p.getMigration().getError()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Counts(1).reserved, 0);
  EXPECT_EQ(Counts(1).used, 0);
  EXPECT_EQ(Counts(0).used, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(StatusOf(*Send("d1", Done(job)).at(0).second)))
      << "the receiver's lease is gone: its late report is refused";
  // It still decodes on pool 0.
  EnvelopeBuilder d(9);
  d.envelope().getBody().initDecode().initSteps(1)[0].setSequence(1);
  auto decoded = Send("c", d);
  ASSERT_EQ(decoded.size(), 1u);
  EXPECT_EQ(decoded[0].first, "d0");
}

TEST_F(BrokerPoolsTest, MigrateMovesAnIdleSequenceAndBackFindsTheSourceCache) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  ASSERT_EQ(PrefillOnPool0(7, 1, -1).size(), 1u);
  auto sent = Send("c", Migrate(8, 1, 1));
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].second->envelope().getBody().isMigrateJob());
  auto replies = Send("d1", Done(sent[0].second->envelope().getBody().getMigrateJob().getJob()));
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].second->envelope().getBody().isMigrateReply());
  EXPECT_EQ(replies[0].second->envelope().getBody().getMigrateReply().getLength(), 100u);
  // Back to pool 0: its cached full block is taken again, only the partial one is copied.
  sent = Send("c", Migrate(9, 1, 0));
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].first, "p0") << "any worker of the destination receives";
  EXPECT_EQ(sent[0].second->envelope().getBody().getMigrateJob().getMoves().size(), 1u);
  replies = Send("p0", Done(sent[0].second->envelope().getBody().getMigrateJob().getJob()));
  const auto m = replies.at(0).second->envelope().getBody().getMigrateReply().getMigration();
  EXPECT_EQ(m.getBlocksMoved(), 1u);
  EXPECT_EQ(m.getBlocksShared(), 1u);
  EXPECT_EQ(Counts(0).used, 2);
  EXPECT_EQ(Counts(1).used, 0);
  // To where it already lives: nothing moves.
  replies = Send("c", Migrate(10, 1, 0));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].second->envelope().getBody().getMigrateReply().getMigration()
                .getTransport(), wire::Transport::NONE);
}

TEST_F(BrokerPoolsTest, BadPoolsAndMissingWorkersGetTypedErrors) {
  Register("p0", wire::Role::PREFILL, 0);
  ASSERT_EQ(PrefillOnPool0(7, 1, -1).size(), 1u);
  EnvelopeBuilder named = Prefill(8, 2, 10);
  named.envelope().getBody().getPrefill().setPool(5);
  EXPECT_EQ(StatusOf(*Send("c", named).at(0).second).code(), absl::StatusCode::kInvalidArgument);
  named.envelope().getBody().getPrefill().setPool(1);  // no prefill worker there
  EXPECT_EQ(StatusOf(*Send("c", named).at(0).second).code(), absl::StatusCode::kUnavailable);
  named.envelope().getBody().getPrefill().setPool(0);
  named.envelope().getBody().getPrefill().setDecodePool(1);  // no decode worker there
  EXPECT_EQ(StatusOf(*Send("c", named).at(0).second).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusOf(*Send("c", Migrate(9, 1, 2)).at(0).second).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusOf(*Send("c", Migrate(9, 1, 1)).at(0).second).code(),
            absl::StatusCode::kUnavailable) << "nobody on pool 1 to receive it";
  EXPECT_EQ(StatusOf(*Send("c", Migrate(9, 42, 1)).at(0).second).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StatusOf(*Send("other", Migrate(9, 1, 0)).at(0).second).code(),
            absl::StatusCode::kFailedPrecondition) << "another client's sequence";
  // A sequence continues on its pool; naming another is refused.
  EnvelopeBuilder more = Prefill(10, 1, 10);
  more.envelope().getBody().getPrefill().setPool(1);
  EXPECT_EQ(StatusOf(*Send("c", more).at(0).second).code(), absl::StatusCode::kFailedPrecondition);
  // A decode's sequences must share a pool.
  Register("d1", wire::Role::DECODE, 1);
  Register("p1", wire::Role::PREFILL, 1);
  EnvelopeBuilder on1 = Prefill(11, 3, 10);
  on1.envelope().getBody().getPrefill().setPool(1);
  auto job = Send("c", on1);
  ASSERT_EQ(job.size(), 1u);
  Send(job[0].first, Done(job[0].second->envelope().getBody().getPrefillJob().getJob()));
  EnvelopeBuilder d(12);
  auto steps = d.envelope().getBody().initDecode().initSteps(2);
  steps[0].setSequence(1);
  steps[1].setSequence(3);
  const absl::Status split = StatusOf(*Send("c", d).at(0).second);
  EXPECT_EQ(split.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.message(), HasSubstr("pool"));
}

TEST_F(BrokerPoolsTest, AMoveThatCannotStartIsSaidInThePrefillsReplyNotAsItsError) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("p1", wire::Role::PREFILL, 1);
  Register("d1", wire::Role::DECODE, 1);
  // Pool 1 full of another sequence, in another namespace (else it would hold the very blocks).
  EnvelopeBuilder fill = Prefill(5, 9, 100 * 64);
  fill.envelope().getBody().getPrefill().setPool(1);
  fill.envelope().getBody().getPrefill().setCacheNamespace("other");
  auto job = Send("c", fill);
  ASSERT_EQ(job.size(), 1u);
  Send(job[0].first, Done(job[0].second->envelope().getBody().getPrefillJob().getJob()));
  ASSERT_EQ(Counts(1).used, 100);
  // Sequence 2's prompt is all prefix hits on pool 0: committed at once, its move cannot fit.
  ASSERT_EQ(PrefillOnPool0(6, 1, -1).size(), 1u);
  EnvelopeBuilder hits = Prefill(7, 2, 64);
  hits.envelope().getBody().getPrefill().setPool(0);
  hits.envelope().getBody().getPrefill().setDecodePool(1);
  auto replies = Send("c", hits);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].second->envelope().getBody().isPrefillReply());
  const auto p = replies[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPrefixHitTokens(), 64u);
  EXPECT_EQ(p.getPool(), 0u);
  ASSERT_TRUE(p.getMigration().hasError());
  EXPECT_EQ(StatusFromWire(p.getMigration().getError()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Counts(1).reserved, 0);
}

TEST_F(BrokerPoolsTest, HealthAndStatsArePerPool) {
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  ASSERT_EQ(PrefillOnPool0(7, 1, -1).size(), 1u);
  EnvelopeBuilder h(20);
  h.envelope().getBody().initHealth();
  auto health = Send("c", h);
  const auto pools = health.at(0).second->envelope().getBody().getHealthReply().getPools();
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0].getPrefillWorkers(), 1u);
  EXPECT_EQ(pools[0].getDecodeWorkers(), 0u);
  EXPECT_EQ(pools[1].getDecodeWorkers(), 1u);
  EXPECT_EQ(pools[0].getGpu(), -1);
  EnvelopeBuilder st(21);
  st.envelope().getBody().initStats();
  auto stats = Send("c", st);
  const auto s = stats.at(0).second->envelope().getBody().getStatsReply();
  EXPECT_EQ(s.getPools()[0].getBlocksUsed(), 2u);
  EXPECT_EQ(s.getPools()[1].getBlocksUsed(), 0u);
  EXPECT_EQ(s.getBlocksUsed(), 2u);
  EXPECT_THAT(broker_->MetricsText(),
              HasSubstr("kvpool_blocks{pool=\"0\",gpu=\"host\",state=\"used\"} 2"));
  EXPECT_THAT(broker_->MetricsText(),
              HasSubstr("kvpool_workers{pool=\"1\",gpu=\"host\",role=\"decode\"} 1"));
}

}  // namespace
}  // namespace kvp
