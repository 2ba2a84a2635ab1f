// The Broker under test with a fake clock and no sockets: two host pools, workers registered and
// messages sent as envelopes, the replies parsed, and the pools' invariants checked after each
// test. BrokerPoolsTest adds prefills on pool 0 and migrations between the two pools.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/broker.h"
#include "gtest/gtest.h"
#include "kernels/capabilities.h"
#include "protocol/capabilities_codec.h"
#include "protocol/status_codec.h"

namespace kvp {

inline constexpr int64_t kWorkerLease = 3'000'000;
inline constexpr int64_t kClientLease = 30'000'000;

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

}  // namespace kvp
