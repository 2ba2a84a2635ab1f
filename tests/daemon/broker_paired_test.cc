// The Broker's paired moves (NCCL, socket): a receive job, then a send job joined by a link, the
// ends' reports, failures on either side, links reused by their pair, moves no worker can make.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/broker_test_fixture.h"

namespace kvp {
namespace {

using ::testing::HasSubstr;

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
