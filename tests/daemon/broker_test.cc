// The Broker's failure rules with a fake clock, no sockets (docs/design.md §7): a worker that goes
// away gives its job back, a client that goes away gets no reply and its blocks return only after
// the job writing them ends, a draining broker refuses new work. Blocks are counted after each
// step.
#include "daemon/broker.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/capabilities.h"
#include "protocol/capabilities_codec.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kWorkerLease = 3'000'000;
constexpr int64_t kClientLease = 30'000'000;

class BrokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolSpec spec;
    spec.num_layers = 2;
    spec.indexer = true;
    absl::StatusOr<BlockLayout> layout = BlockLayout::Create(spec);
    ASSERT_TRUE(layout.ok());
    auto pool = Pool::Create(spec, 100 * layout->block_stride(), &clock_, kWorkerLease);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    BrokerOptions options;
    options.worker_lease_micros = kWorkerLease;
    options.client_lease_micros = kClientLease;
    options.model.topk = 64;
    options.epoch = broker_epoch_;
    broker_ = std::make_unique<Broker>(pool_.get(), &clock_, options);
  }

  // Whatever a test did, no block is lost or owned twice and the tables agree with the allocator.
  void TearDown() override {
    const absl::Status s = pool_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  // Sends `message` from `from`; the messages the broker sends, parsed.
  std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>> Send(
      const std::string& from, const EnvelopeBuilder& message) {
    Outbox out;
    broker_->Handle(from, message.Frame(), out);
    return Parse(std::move(out));
  }
  std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>> Tick() {
    Outbox out;
    broker_->Tick(out);
    return Parse(std::move(out));
  }
  static std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>> Parse(Outbox out) {
    std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>> parsed;
    for (Outgoing& o : out) {
      auto p = ParseEnvelope(std::move(o.frames));
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) parsed.emplace_back(o.to, std::move(*p));
    }
    return parsed;
  }

  void Register(const std::string& worker, wire::Role role) {
    EnvelopeBuilder m(1);
    auto r = m.envelope().getBody().initRegister();
    r.setRole(role);
    ServedToWire(kHostCapabilities.Decode(), r.initCapabilities().initHostArena());
    auto replies = Send(worker, m);
    ASSERT_GE(replies.size(), 1u);
    ASSERT_TRUE(replies[0].second->envelope().getBody().isRegisterReply());
    leases_[worker] = replies[0].second->envelope().getBody().getRegisterReply().getLease();
  }
  void Heartbeat(const std::string& worker) {
    EnvelopeBuilder m(2);
    auto h = m.envelope().getBody().initHeartbeat();
    h.setLease(leases_[worker]);
    h.setEpoch(broker_epoch_);
    Send(worker, m);
  }
  EnvelopeBuilder Prefill(uint64_t id, uint64_t seq, int tokens) {
    EnvelopeBuilder m(id);
    auto p = m.envelope().getBody().initPrefill();
    p.setSequence(seq);
    auto t = p.initTokens(tokens);
    for (int i = 0; i < tokens; ++i) t.set(i, i + 1);
    return m;
  }
  static EnvelopeBuilder Done(uint64_t job) {
    EnvelopeBuilder m(job);
    m.envelope().getBody().initJobDone().setJob(job);
    return m;
  }
  static absl::Status StatusOf(const ParsedEnvelope& e) {
    const auto body = e.envelope().getBody();
    return body.isError() ? StatusFromWire(body.getError()) : absl::OkStatus();
  }
  PoolCounts Counts() const { return pool_->blocks().counts(); }

  const uint64_t broker_epoch_ = 1000;
  FakeClock clock_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<Broker> broker_;
  std::map<std::string, LeaseId> leases_;
};

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
  EXPECT_EQ(pool_->sequences().size(), 0u);
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
  EXPECT_EQ(pool_->sequences().size(), 0u);
  EXPECT_EQ(Counts().free, pool_->blocks().num_blocks());
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
