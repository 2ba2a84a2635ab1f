// The Broker's failure rules with a fake clock, no sockets (docs/design.md §7): a worker that goes
// away gives its job back, a client that goes away gets no reply and its blocks return only after
// the job writing them ends, a draining broker refuses new work. Blocks are counted after each
// step.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/broker_test_fixture.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

TEST_F(BrokerTest, PrefillIsDispatchedCommittedAndAnswered) {
  Register("w1", wire::Role::PREFILL);
  auto sent = Send("c", Prefill(7, 1, 100));
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "w1");
  ASSERT_TRUE(sent[0].second->envelope().getBody().isPrefillJob());
  const uint64_t job = sent[0].second->envelope().getBody().getPrefillJob().getJob();
  EXPECT_EQ(Counts().reserved, 2);
  auto replies = Send("w1", Done(job));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].first, "c");
  EXPECT_EQ(replies[0].second->request_id(), 7u);
  ASSERT_TRUE(replies[0].second->envelope().getBody().isPrefillReply());
  EXPECT_EQ(replies[0].second->envelope().getBody().getPrefillReply().getLength(), 100u);
  EXPECT_EQ(Counts().used, 2);
  EXPECT_EQ(Counts().reserved, 0);
}

TEST_F(BrokerTest, AWorkerThatGoesAwayHandsItsJobToAnother) {
  Register("w1", wire::Role::PREFILL);
  Register("w2", wire::Role::PREFILL);
  auto sent = Send("c", Prefill(7, 1, 100));
  ASSERT_EQ(sent.size(), 1u);
  const std::string first = sent[0].first;
  const std::string other = first == "w1" ? "w2" : "w1";
  clock_.Advance(kWorkerLease / 2);
  Heartbeat(other);
  clock_.Advance(kWorkerLease / 2 + 1);
  auto resent = Tick();  // `first` expired: its job goes to `other`
  ASSERT_EQ(resent.size(), 1u);
  EXPECT_EQ(resent[0].first, other);
  const uint64_t job = resent[0].second->envelope().getBody().getPrefillJob().getJob();
  // A late report from the expired worker is refused; the stand-in's is taken.
  EXPECT_TRUE(absl::IsFailedPrecondition(StatusOf(*Send(first, Done(job)).at(0).second)));
  auto replies = Send(other, Done(job));
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(StatusOf(*replies[0].second).ok());
  EXPECT_EQ(Counts().used, 2);
}

TEST_F(BrokerTest, AWorkerThatGoesAwayWithoutAStandInFailsTheJobWithAborted) {
  Register("w1", wire::Role::PREFILL);
  Send("c", Prefill(7, 1, 100));
  clock_.Advance(kWorkerLease + 1);
  auto replies = Tick();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].first, "c");
  const absl::Status s = StatusOf(*replies[0].second);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("nothing was committed"));
  EXPECT_EQ(Counts().reserved, 0);
  EXPECT_EQ(Counts().used, 0);
}

TEST_F(BrokerTest, ADeadClientsBlocksReturnOnlyWhenTheJobWritingThemEnds) {
  Register("w1", wire::Role::PREFILL);
  auto sent = Send("c", Prefill(7, 1, 100));
  const uint64_t job = sent.at(0).second->envelope().getBody().getPrefillJob().getJob();
  for (int64_t t = 0; t <= kClientLease; t += kWorkerLease / 2) {  // the worker stays alive
    clock_.Advance(kWorkerLease / 2);
    Heartbeat("w1");
  }
  EXPECT_TRUE(Tick().empty());  // the client's lease expired
  EXPECT_EQ(Counts().reserved, 2) << "still being written: not free yet";
  EXPECT_TRUE(Send("w1", Done(job)).empty()) << "no reply to a client that is gone";
  EXPECT_EQ(Counts().reserved, 0);
  EXPECT_EQ(Counts().used, 0);
  EXPECT_EQ(pools_->num_sequences(), 0u);
}

TEST_F(BrokerTest, SequencesWithAJobInFlightAreNotTouched) {
  Register("w1", wire::Role::PREFILL);
  Send("c", Prefill(7, 1, 100));
  EnvelopeBuilder release(8);
  release.envelope().getBody().initRelease().setSequence(1);
  absl::Status s = StatusOf(*Send("c", release).at(0).second);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EnvelopeBuilder fork(9);
  fork.envelope().getBody().initFork().setSource(1);
  s = StatusOf(*Send("c", fork).at(0).second);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(Counts().reserved, 2);
}

TEST_F(BrokerTest, ADrainingBrokerRefusesNewWorkAndFinishesJobsInFlight) {
  Register("w1", wire::Role::PREFILL);
  auto sent = Send("c", Prefill(7, 1, 100));
  const uint64_t job = sent.at(0).second->envelope().getBody().getPrefillJob().getJob();
  broker_->StartDrain();
  EXPECT_FALSE(broker_->Idle());
  const absl::Status s = StatusOf(*Send("c", Prefill(8, 2, 10)).at(0).second);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(StatusOf(*Send("w1", Done(job)).at(0).second).ok());
  EXPECT_TRUE(broker_->Idle());
}

TEST_F(BrokerTest, AHeartbeatFromAnEarlierKvpooldIsAborted) {
  Register("w1", wire::Role::DECODE);
  EnvelopeBuilder m(2);
  auto h = m.envelope().getBody().initHeartbeat();
  h.setLease(leases_["w1"]);
  h.setEpoch(12345);  // this broker's epoch is broker_epoch_
  const absl::Status s = StatusOf(*Send("w1", m).at(0).second);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
}

TEST_F(BrokerTest, AbortingTheFirstAppendOfANewSequenceAnswersLengthZero) {
  // The engine sequence that used to take kvpoold down: Append creates the sequence, Abort of
  // that append removes it again.
  EnvelopeBuilder append(1);
  auto a = append.envelope().getBody().initAppend();
  a.setSequence(5);
  a.initTokens(3).set(0, 1);
  ASSERT_TRUE(StatusOf(*Send("c", append).at(0).second).ok());
  EnvelopeBuilder abort(2);
  abort.envelope().getBody().initAbort().setSequence(5);
  auto replies = Send("c", abort);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].second->envelope().getBody().isAbortReply());
  EXPECT_EQ(replies[0].second->envelope().getBody().getAbortReply().getLength(), 0u);
  EXPECT_EQ(pools_->num_sequences(), 0u);
  EXPECT_EQ(Counts().free, pools_->pool(0).blocks().num_blocks() * 2);
}

TEST_F(BrokerTest, RepliesCarryTheEpochAndAnUnknownSequenceNamesARestart) {
  EnvelopeBuilder release(4);
  release.envelope().getBody().initRelease().setSequence(42);
  release.envelope().setEpoch(777);  // the client last heard from another kvpoold
  auto replies = Send("c", release);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].second->envelope().getEpoch(), broker_epoch_);
  const absl::Status s = StatusOf(*replies[0].second);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("has restarted"));
  release.envelope().setEpoch(broker_epoch_);
  EXPECT_THAT(StatusOf(*Send("c", release).at(0).second).message(),
              ::testing::Not(HasSubstr("restarted")));
}

}  // namespace
}  // namespace kvp
