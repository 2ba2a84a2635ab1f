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
    auto pools = PoolSet::Create(spec, 100 * layout->block_stride(), 2, &clock_, kWorkerLease);
    ASSERT_TRUE(pools.ok());
    pools_ = std::move(*pools);
    broker_ = std::make_unique<Broker>(pools_.get(), &clock_, DefaultOptions());
  }
  BrokerOptions DefaultOptions() const {
    BrokerOptions options;
    options.pool_gpus = {-1, -1};
    options.fd_channel_paths = {"/run/test/fd-0", "/run/test/fd-1"};
    options.worker_lease_micros = kWorkerLease;
    options.client_lease_micros = kClientLease;
    options.model.topk = 64;
    options.epoch = broker_epoch_;
    return options;
  }

  // Whatever a test did, no block is lost or owned twice and the tables agree with the allocator.
  void TearDown() override {
    const absl::Status s = pools_->CheckInvariants();
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

  // A host worker, or (cuda) one of a cuda arena, with NCCL or not.
  void Register(const std::string& worker, wire::Role role, int32_t pool = 0, bool cuda = false,
                bool nccl = false) {
    EnvelopeBuilder m(1);
    auto r = m.envelope().getBody().initRegister();
    r.setRole(role);
    r.setPool(pool);
    auto caps = r.initCapabilities();
    const BackendCapabilities& served = cuda ? kCudaCapabilities : kHostCapabilities;
    const OpCapabilities& ops = role == wire::Role::PREFILL ? served.cache_write : served.Decode();
    ServedToWire(ops, cuda ? caps.initCudaArena() : caps.initHostArena());
    caps.setCuda(cuda);
    caps.setNccl(nccl);
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
  PoolCounts Counts() const { return pools_->counts(); }
  PoolCounts Counts(PoolIndex pool) const { return pools_->pool(pool).blocks().counts(); }

  const uint64_t broker_epoch_ = 1000;
  FakeClock clock_;
  std::unique_ptr<PoolSet> pools_;
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

namespace kvp {
namespace {

// ---- Pools and migrations ----

class BrokerPoolsTest : public BrokerTest {
 protected:
  // Prefills 100 tokens of `seq` on pool 0 (decode pool `decode_pool`): the prefill job done.
  std::vector<std::pair<std::string, std::unique_ptr<ParsedEnvelope>>> PrefillOnPool0(
      uint64_t id, uint64_t seq, int32_t decode_pool) {
    EnvelopeBuilder m = Prefill(id, seq, 100);
    m.envelope().getBody().getPrefill().setPool(0);
    m.envelope().getBody().getPrefill().setDecodePool(decode_pool);
    auto sent = Send("c", m);
    EXPECT_EQ(sent.size(), 1u);
    if (sent.size() != 1) return {};
    EXPECT_EQ(sent[0].first, "p0");
    return Send("p0", Done(sent[0].second->envelope().getBody().getPrefillJob().getJob()));
  }
  static EnvelopeBuilder Migrate(uint64_t id, uint64_t seq, uint32_t to) {
    EnvelopeBuilder m(id);
    auto r = m.envelope().getBody().initMigrate();
    r.setSequence(seq);
    r.setToPool(to);
    return m;
  }
};

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

// ---- Sliced prefills: each slice's full blocks stream to the decode pool during the next ----

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

// ---- Paired moves (nccl, socket): a receive job, then a send job joined by a link ----

class BrokerPairedTest : public BrokerPoolsTest {
 protected:
  void UseOptions(const BrokerOptions& options) {
    broker_ = std::make_unique<Broker>(pools_.get(), &clock_, options);
  }
  static EnvelopeBuilder Ready(uint64_t job, const std::string& rendezvous) {
    EnvelopeBuilder m(0);
    auto r = m.envelope().getBody().initTransferReady();
    r.setJob(job);
    r.setRendezvous(kj::arrayPtr(reinterpret_cast<const kj::byte*>(rendezvous.data()),
                                 rendezvous.size()));
    return m;
  }
  static EnvelopeBuilder Failed(uint64_t job, const absl::Status& why) {
    EnvelopeBuilder m(job);
    auto f = m.envelope().getBody().initJobFailed();
    f.setJob(job);
    StatusToWire(why, f.initError());
    return m;
  }
  static wire::TransferLink::Reader LinkOf(const ParsedEnvelope& e) {
    return e.envelope().getBody().getMigrateJob().getLink();
  }
  static uint64_t JobOf(const ParsedEnvelope& e) {
    return e.envelope().getBody().getMigrateJob().getJob();
  }
  static std::string Bytes(capnp::Data::Reader d) { return std::string(d.begin(), d.end()); }
};

TEST_F(BrokerPairedTest, ASocketMoveJoinsItsTwoWorkersAndEndsOnTheReceiversReport) {
  BrokerOptions options = DefaultOptions();
  options.transport = wire::Transport::SOCKET;
  options.pool_chunk_bytes = {1 << 20, 2 << 20};
  UseOptions(options);
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  auto sent = PrefillOnPool0(7, 1, 1);
  // The receive job only: the sender is taken (no other job reaches it) but waits for the link.
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, "d1");
  EXPECT_EQ(sent[0].second->envelope().getBody().getMigrateJob().getTransport(),
            wire::Transport::SOCKET);
  const uint64_t job = JobOf(*sent[0].second);
  const auto link = LinkOf(*sent[0].second);
  EXPECT_EQ(link.getSide(), wire::TransferSide::RECEIVE);
  EXPECT_TRUE(link.getFresh());
  EXPECT_EQ(link.getToken().size(), 32u);
  EXPECT_EQ(link.getDeadlineMillis(), 20'000u);
  EXPECT_EQ(link.getSourceChunkBytes(), 1u << 20);
  EXPECT_EQ(link.getTargetChunkBytes(), 2u << 20);
  const std::string token = Bytes(link.getToken());
  EXPECT_TRUE(Send("c", Prefill(8, 2, 10)).empty()) << "p0 is the move's sender: queued";

  auto joined = Send("d1", Ready(job, "127.0.0.1:4242"));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0].first, "p0");
  const auto send = LinkOf(*joined[0].second);
  EXPECT_EQ(send.getSide(), wire::TransferSide::SEND);
  EXPECT_EQ(Bytes(send.getRendezvous()), "127.0.0.1:4242");
  EXPECT_EQ(Bytes(send.getToken()), token);
  EXPECT_EQ(send.getId(), link.getId());
  EXPECT_EQ(joined[0].second->envelope().getBody().getMigrateJob().getMoves().size(), 2u);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      StatusOf(*Send("d1", Ready(job, "127.0.0.1:1")).at(0).second)))
      << "a link is opened once";

  // The sender's report frees it (the queued prefill goes out); the receiver's ends the move.
  auto freed = Send("p0", Done(job));
  ASSERT_EQ(freed.size(), 1u);
  EXPECT_EQ(freed[0].first, "p0");
  ASSERT_TRUE(freed[0].second->envelope().getBody().isPrefillJob());
  EXPECT_EQ(Counts(1).reserved, 2) << "not committed before the receiver reports";
  auto replies = Send("d1", Done(job));
  ASSERT_EQ(replies.size(), 1u);
  const auto p = replies[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 1u);
  EXPECT_EQ(p.getMigration().getTransport(), wire::Transport::SOCKET);
  EXPECT_EQ(Counts(1).used, 2);
  Send("p0", Done(freed[0].second->envelope().getBody().getPrefillJob().getJob()));
}

TEST_F(BrokerPairedTest, APairedMoveTakesItsSenderBeforeTheSendersOwnQueuedJobs) {
  BrokerOptions options = DefaultOptions();
  options.transport = wire::Transport::SOCKET;
  UseOptions(options);
  // p0 is wanted by its own queue and, as the only worker of pool 0, by the move as its sender;
  // the move must win whatever order the broker looks at its workers in.
  Register("p1", wire::Role::PREFILL, 1);
  Register("p0", wire::Role::PREFILL, 0);
  Register("d1", wire::Role::DECODE, 1);
  ASSERT_EQ(PrefillOnPool0(5, 3, -1).size(), 1u);  // sequence 3 lives on pool 0
  // p0 writes sequence 4, sequence 5's prefill waits for it, and so does the move of 3.
  EnvelopeBuilder four = Prefill(6, 4, 10), five = Prefill(7, 5, 10);
  four.envelope().getBody().getPrefill().setPool(0);
  five.envelope().getBody().getPrefill().setPool(0);
  auto running = Send("c", four);
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].first, "p0");
  EXPECT_TRUE(Send("c", five).empty());
  EXPECT_TRUE(Send("c", Migrate(8, 3, 1)).empty()) << "no idle sender on pool 0";
  // p0 is free: it becomes the move's sender (its receiver d1 is idle) before it takes prefill 5,
  // so a source pool kept busy by its own jobs cannot starve moves out of it.
  auto next = Send("p0", Done(running[0].second->envelope().getBody().getPrefillJob().getJob()));
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].first, "c");
  EXPECT_TRUE(next[0].second->envelope().getBody().isPrefillReply());
  const std::string receiver = next[1].first;  // either worker of pool 1
  EXPECT_THAT(receiver, ::testing::AnyOf("p1", "d1"));
  ASSERT_TRUE(next[1].second->envelope().getBody().isMigrateJob());
  const uint64_t move = JobOf(*next[1].second);
  auto send = Send(receiver, Ready(move, "127.0.0.1:4242"));
  ASSERT_EQ(send.size(), 1u);
  EXPECT_EQ(send[0].first, "p0");
  auto prefill5 = Send("p0", Done(move));  // the sender is free: now prefill 5
  ASSERT_EQ(prefill5.size(), 1u);
  EXPECT_TRUE(prefill5[0].second->envelope().getBody().isPrefillJob());
  ASSERT_EQ(Send(receiver, Done(move)).size(), 1u);
  Send("p0", Done(prefill5[0].second->envelope().getBody().getPrefillJob().getJob()));
}

TEST_F(BrokerPairedTest, AReceiverThatFailsAbortsTheMoveAndTheSendersLateReportIsTaken) {
  BrokerOptions options = DefaultOptions();
  options.transport = wire::Transport::SOCKET;
  UseOptions(options);
  Register("p0", wire::Role::PREFILL, 0);
  Register("d0", wire::Role::DECODE, 0);
  Register("d1", wire::Role::DECODE, 1);
  auto sent = PrefillOnPool0(7, 1, 1);
  ASSERT_EQ(sent.size(), 1u);
  const uint64_t job = JobOf(*sent[0].second);
  auto joined = Send("d1", Ready(job, "127.0.0.1:4242"));
  ASSERT_EQ(joined.size(), 1u);
  const std::string sender = joined[0].first;
  auto replies = Send("d1", Failed(job, absl::UnavailableError("the peer closed the connection")));
  ASSERT_EQ(replies.size(), 1u);
  const auto p = replies[0].second->envelope().getBody().getPrefillReply();
  EXPECT_EQ(p.getPool(), 0u) << "still on the source";
  EXPECT_EQ(StatusFromWire(p.getMigration().getError()).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Counts(1).reserved, 0);
  EXPECT_EQ(Counts(0).used, 2);
  // The sender, still busy, reports later: taken without an error reply, and it is free.
  EXPECT_TRUE(Send(sender, Failed(job, absl::UnavailableError("broken pipe"))).empty());
  EXPECT_TRUE(absl::IsNotFound(StatusOf(*Send(sender, Done(job)).at(0).second)))
      << "reported once";
}

TEST_F(BrokerPairedTest, AnNcclLinkIsReusedByItsPairAndClosedByAFailure) {
  BrokerOptions options = DefaultOptions();
  options.pool_gpus = {0, 1};  // no peer access reported: NCCL
  UseOptions(options);
  Register("s0", wire::Role::DECODE, 0, /*cuda=*/true, /*nccl=*/true);
  Register("r1", wire::Role::DECODE, 1, /*cuda=*/true, /*nccl=*/true);
  Register("p0", wire::Role::PREFILL, 0, /*cuda=*/true, /*nccl=*/false);
  // Appended by an engine on pool 0, then moved: the sender is s0, pool 0's worker with NCCL.
  const auto move = [&](uint64_t id, uint64_t seq) {
    EnvelopeBuilder a(id);
    auto r = a.envelope().getBody().initAppend();
    r.setSequence(seq);
    r.setPool(0);
    auto t = r.initTokens(70);
    for (int i = 0; i < 70; ++i) t.set(i, static_cast<int32_t>(seq * 1000 + i));
    EXPECT_TRUE(Send("c", a).at(0).second->envelope().getBody().isAppendReply());
    EnvelopeBuilder c(id + 1);
    c.envelope().getBody().initCommit().setSequence(seq);
    EXPECT_TRUE(Send("c", c).at(0).second->envelope().getBody().isCommitReply());
    return Send("c", Migrate(id + 2, seq, 1));
  };
  auto first = move(10, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].first, "r1");
  EXPECT_EQ(first[0].second->envelope().getBody().getMigrateJob().getTransport(),
            wire::Transport::NCCL);
  const auto link = LinkOf(*first[0].second);
  ASSERT_TRUE(link.getFresh());
  EXPECT_EQ(link.getToken().size(), 0u) << "NCCL links need no token";
  const uint64_t job1 = JobOf(*first[0].second);
  auto joined = Send("r1", Ready(job1, std::string(128, 'u')));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0].first, "s0");
  Send("s0", Done(job1));
  ASSERT_TRUE(Send("r1", Done(job1)).at(0).second->envelope().getBody().isMigrateReply());

  // The same pair again: both jobs at once on the open link.
  auto second = move(20, 2);
  ASSERT_EQ(second.size(), 2u);
  for (const auto& [to, message] : second) {
    EXPECT_FALSE(LinkOf(*message).getFresh());
    EXPECT_EQ(LinkOf(*message).getId(), link.getId());
    EXPECT_EQ(LinkOf(*message).getSide(),
              to == "r1" ? wire::TransferSide::RECEIVE : wire::TransferSide::SEND);
  }
  const uint64_t job2 = JobOf(*second[0].second);
  const absl::Status late = absl::DeadlineExceededError("the link's deadline passed");
  ASSERT_EQ(Send("r1", Failed(job2, late)).size(), 1u) << "the client's error";
  EXPECT_TRUE(Send("s0", Failed(job2, late)).empty());

  // Closed by the failure: the next move opens a fresh link.
  auto third = move(30, 3);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_TRUE(LinkOf(*third[0].second).getFresh());
  EXPECT_NE(LinkOf(*third[0].second).getId(), link.getId());
}

TEST_F(BrokerPairedTest, MovesThatNoWorkerCanMakeAreUnimplemented) {
  BrokerOptions options = DefaultOptions();
  options.pool_gpus = {0, 1};
  UseOptions(options);
  Register("p0", wire::Role::PREFILL, 0, /*cuda=*/true, /*nccl=*/false);
  Register("d1", wire::Role::DECODE, 1, /*cuda=*/true, /*nccl=*/false);
  ASSERT_EQ(PrefillOnPool0(7, 1, -1).size(), 1u);
  const absl::Status no_nccl = StatusOf(*Send("c", Migrate(8, 1, 1)).at(0).second);
  EXPECT_TRUE(absl::IsUnimplemented(no_nccl)) << no_nccl;
  EXPECT_THAT(no_nccl.message(), HasSubstr("NCCL"));
}

TEST_F(BrokerPairedTest, AForcedTransportThatCannotMoveThesePoolsIsUnimplemented) {
  BrokerOptions options = DefaultOptions();
  options.pool_gpus = {0, 1};
  options.transport = wire::Transport::SOCKET;  // host pools only
  UseOptions(options);
  Register("p0", wire::Role::PREFILL, 0, /*cuda=*/true, /*nccl=*/true);
  Register("d1", wire::Role::DECODE, 1, /*cuda=*/true, /*nccl=*/true);
  EnvelopeBuilder m = Prefill(7, 1, 100);
  m.envelope().getBody().getPrefill().setPool(0);
  m.envelope().getBody().getPrefill().setDecodePool(1);
  const absl::Status refused = StatusOf(*Send("c", m).at(0).second);
  EXPECT_TRUE(absl::IsUnimplemented(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("host pools only"));
}

}  // namespace
}  // namespace kvp
