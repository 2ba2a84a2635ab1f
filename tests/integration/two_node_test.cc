// Two nodes on one machine (docs/design.md §11): two kvpoolds of the host backend, each with its
// own runtime directory and workers, peers of each other over CURVE on loopback. A sequence
// prefilled on node a and decoded on node b decodes bit for bit as it does on a alone, and a peer
// that node b does not list gets nowhere, with nothing lost on the node that asked; nor is
// anything lost or leaked when node b's kvpoold, its workers or node a's die mid-move.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/curve.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

using ::testing::HasSubstr;

// A node's key pair and tcp endpoint, and the peers file it reads.
struct NodeConfig {
  std::string name;
  std::string endpoint;
  CurveKeyPair keys;
};

class TwoNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpool-nodes-XXXXXX";
    dir_ = ::mkdtemp(dir);
    for (const char* name : {"a", "b", "c"}) {
      nodes_.push_back({.name = name,
                        .endpoint = absl::StrCat("tcp://127.0.0.1:", FreePort()),
                        .keys = *NewCurveKeyPair()});
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Starts node `i`, listing the nodes `peers` as its peers.
  std::unique_ptr<ServiceProcesses> StartNode(size_t i, const std::vector<size_t>& peers,
                                              std::vector<std::string> worker_flags = {}) {
    const NodeConfig& node = nodes_[i];
    const std::string secret = absl::StrCat(dir_, "/", node.name, ".key");
    const std::string peers_file = absl::StrCat(dir_, "/", node.name, ".peers");
    EXPECT_TRUE(WriteCurveKeyFile(secret, node.keys.secret_key, 0600).ok());
    std::string text = "# name endpoint key\n";
    for (size_t p : peers) {
      absl::StrAppend(&text, nodes_[p].name, " ", nodes_[p].endpoint, " ",
                      nodes_[p].keys.public_key, "\n");
    }
    EXPECT_TRUE(WriteCurveKeyFile(peers_file, text, 0600).ok());
    ServiceOptions options;
    options.worker_flags = std::move(worker_flags);
    options.daemon_flags = {absl::StrCat("--node_name=", node.name),
                            absl::StrCat("--peers_file=", peers_file),
                            absl::StrCat("--tcp_endpoint=", node.endpoint),
                            absl::StrCat("--curve_secret_key_file=", secret),
                            "--transfer_timeout_ms=1500"};
    absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Waits until `client`'s kvpoold has heard from `peer`.
  static void WaitForPeer(Client& client, const std::string& peer) {
    for (int i = 0; i < 100; ++i) {
      absl::StatusOr<PoolStats> stats = client.Stats();
      ASSERT_TRUE(stats.ok()) << stats.status();
      for (const PoolStats::Peer& p : stats->peers) {
        if (p.name == peer && p.reachable) return;
      }
      ::usleep(50'000);
    }
    FAIL() << "peer " << peer << " never became reachable";
  }

  // A node's kvpoold holds no sequence and no block, used or reserved.
  static void ExpectHoldsNothing(Client& client) {
    absl::StatusOr<PoolStats> stats = client.Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->sequences, 0u);
    EXPECT_EQ(stats->blocks_used + stats->blocks_reserved, 0u);
  }

  static std::vector<DecodeStepResult> DecodeSteps(Client& client, uint64_t seq, int steps) {
    std::vector<DecodeStepResult> results;
    for (int i = 0; i < steps; ++i) {
      absl::StatusOr<DecodeResult> r =
          client.Decode({DecodeStepRequest{seq, 100 + i, std::nullopt, nullptr, nullptr}},
                        wire::OutputLayers::ALL);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return results;
      results.push_back(r->steps.at(0));
    }
    return results;
  }

  std::string dir_;
  std::vector<NodeConfig> nodes_;
};

TEST_F(TwoNodeTest, PrefilledOnOneNodeDecodesOnTheOtherBitForBit) {
  std::unique_ptr<ServiceProcesses> a = StartNode(0, {1});
  std::unique_ptr<ServiceProcesses> b = StartNode(1, {0});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Client client_a(a->client_options("engine"));
  Client client_b(b->client_options("observer"));
  WaitForPeer(client_a, "b");
  std::vector<int32_t> prompt(150);
  std::iota(prompt.begin(), prompt.end(), 7);

  // On node a alone, for reference.
  ASSERT_TRUE(client_a.Prefill(1, prompt).ok());
  const std::vector<DecodeStepResult> here = DecodeSteps(client_a, 1, 3);
  ASSERT_TRUE(client_a.Release(1).ok());

  absl::StatusOr<PrefillResult> moved =
      client_a.Prefill(2, prompt, nullptr, nullptr, {.decode_pool = 0, .decode_node = "b"});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->node, "b");
  EXPECT_EQ(moved->length, 150);
  ASSERT_TRUE(moved->migration.has_value());
  EXPECT_TRUE(moved->migration->error.ok()) << moved->migration->error;
  EXPECT_EQ(moved->migration->to_node, "b");
  EXPECT_EQ(moved->migration->transport, wire::Transport::SOCKET);
  EXPECT_EQ(moved->migration->blocks_moved, 3u);  // 150 tokens in blocks of 64
  EXPECT_GT(moved->migration->bytes, 0u);

  // It lives on b now: a holds none of its blocks, b holds them under a's lease.
  absl::StatusOr<PoolStats> stats_a = client_a.Stats();
  ASSERT_TRUE(stats_a.ok());
  EXPECT_EQ(stats_a->blocks_used, 0u);
  ASSERT_EQ(stats_a->remote_sequences.size(), 1u);
  EXPECT_EQ(stats_a->remote_sequences[0].sequence, 2u);
  EXPECT_EQ(stats_a->remote_sequences[0].node, "b");
  ASSERT_EQ(stats_a->peers.size(), 1u);
  EXPECT_EQ(stats_a->peers[0].sequences, 1u);
  absl::StatusOr<PoolStats> stats_b = client_b.Stats();
  ASSERT_TRUE(stats_b.ok());
  EXPECT_EQ(stats_b->sequences, 1u);
  EXPECT_EQ(stats_b->blocks_used, 3u);

  const std::vector<DecodeStepResult> there = DecodeSteps(client_a, 2, 3);
  ASSERT_EQ(there.size(), here.size());
  for (size_t i = 0; i < here.size(); ++i) {
    EXPECT_EQ(there[i].sequence, 2u);
    EXPECT_EQ(there[i].length, here[i].length);
    EXPECT_EQ(there[i].out, here[i].out) << "step " << i;
    EXPECT_EQ(there[i].topk, here[i].topk) << "step " << i;
  }
  // Only decode and release go there; the rest is refused, naming the node.
  absl::StatusOr<PrefillResult> again = client_a.Prefill(2, prompt);
  ASSERT_FALSE(again.ok());
  EXPECT_THAT(again.status().message(), HasSubstr("lives on node b"));

  absl::StatusOr<uint32_t> released = client_a.Release(2);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, 3u);  // 153 tokens in blocks of 64
  ExpectHoldsNothing(client_b);
  stats_a = client_a.Stats();
  ASSERT_TRUE(stats_a.ok());
  EXPECT_TRUE(stats_a->remote_sequences.empty());
}

TEST_F(TwoNodeTest, AMigrateToAnotherNodeAndItsErrors) {
  std::unique_ptr<ServiceProcesses> a = StartNode(0, {1});
  std::unique_ptr<ServiceProcesses> b = StartNode(1, {0});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Client client_a(a->client_options("engine"));
  WaitForPeer(client_a, "b");
  std::vector<int32_t> prompt(64, 3);
  ASSERT_TRUE(client_a.Prefill(5, prompt).ok());
  absl::StatusOr<MigrationResult> unknown = client_a.Migrate(5, 0, "z");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("not a peer"));
  absl::StatusOr<MigrationResult> no_pool = client_a.Migrate(5, 7, "b");
  ASSERT_FALSE(no_pool.ok());
  EXPECT_EQ(no_pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_pool.status().message(), HasSubstr("pool 7 does not exist"));
  absl::StatusOr<MigrationResult> moved = client_a.Migrate(5, 0, "b");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->length, 64);
  EXPECT_EQ(moved->to_node, "b");
  EXPECT_EQ(DecodeSteps(client_a, 5, 1).size(), 1u);
}

TEST_F(TwoNodeTest, APeerTheOtherDoesNotListGetsNowhereAndKeepsItsSequence) {
  std::unique_ptr<ServiceProcesses> b = StartNode(1, {0});     // lists a, not c
  std::unique_ptr<ServiceProcesses> c = StartNode(2, {1});     // lists b
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  Client client_c(c->client_options("engine"));
  std::vector<int32_t> prompt(100, 9);
  absl::StatusOr<PrefillResult> r =
      client_c.Prefill(3, prompt, nullptr, nullptr, {.decode_pool = 0, .decode_node = "b"});
  ASSERT_TRUE(r.ok()) << r.status();  // written; the move's failure is in its report
  ASSERT_TRUE(r->migration.has_value());
  EXPECT_EQ(r->migration->error.code(), absl::StatusCode::kUnavailable)
      << r->migration->error;
  EXPECT_THAT(r->migration->error.message(), HasSubstr("still lives in pool 0"));
  EXPECT_EQ(r->node, "");
  absl::StatusOr<PoolStats> stats = client_c.Stats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->peers.size(), 1u);
  EXPECT_FALSE(stats->peers[0].reachable);
  EXPECT_TRUE(stats->remote_sequences.empty());
  EXPECT_EQ(DecodeSteps(client_c, 3, 1).size(), 1u);  // still here, still readable
  Client client_b(b->client_options("observer"));
  ExpectHoldsNothing(client_b);
}

// Who dies while a move from node a to node b is under way.
enum class Victim { kPeerDaemon, kReceivingWorkers, kSendingWorkers };

class TwoNodeKillTest : public TwoNodeTest, public ::testing::WithParamInterface<Victim> {};

TEST_P(TwoNodeKillTest, NothingIsLeakedAndTheSequenceStaysWhereItWas) {
  // a's senders are paced (1 MiB slices) so that the move of 3.3 MB takes about 0.8 s.
  std::unique_ptr<ServiceProcesses> a = StartNode(0, {1}, {"--transfer_max_mib_per_s=4"});
  std::unique_ptr<ServiceProcesses> b = StartNode(1, {0});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Client client_a(a->client_options("engine"));
  WaitForPeer(client_a, "b");
  std::vector<int32_t> prompt(1024);
  std::iota(prompt.begin(), prompt.end(), 1);
  ASSERT_TRUE(client_a.Prefill(9, prompt).ok());
  absl::StatusOr<PoolStats> before = client_a.Stats();
  ASSERT_TRUE(before.ok());

  absl::Status moved;
  std::thread mover([&] { moved = client_a.Migrate(9, 0, "b").status(); });
  ::usleep(300'000);  // the receiver has opened its link and the bytes are flowing
  const Victim victim = GetParam();
  if (victim == Victim::kPeerDaemon) b->Stop(b->daemon(), SIGKILL);
  if (victim == Victim::kReceivingWorkers) {
    for (pid_t w : b->prefill_workers()) b->Stop(w, SIGKILL);
    for (pid_t w : b->decode_workers()) b->Stop(w, SIGKILL);
  }
  if (victim == Victim::kSendingWorkers) {
    for (pid_t w : a->prefill_workers()) a->Stop(w, SIGKILL);
    for (pid_t w : a->decode_workers()) a->Stop(w, SIGKILL);
  }
  mover.join();
  ASSERT_FALSE(moved.ok());
  EXPECT_TRUE(absl::IsUnavailable(moved) || absl::IsAborted(moved) ||
              absl::IsDeadlineExceeded(moved))
      << moved;
  EXPECT_THAT(moved.message(), HasSubstr("still lives in pool 0"));

  // Still on a, whole, with nothing reserved; nothing held on b.
  absl::StatusOr<PoolStats> after = client_a.Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->blocks_used, before->blocks_used);
  EXPECT_EQ(after->blocks_reserved, 0u);
  EXPECT_TRUE(after->remote_sequences.empty());
  if (victim != Victim::kSendingWorkers) {
    EXPECT_EQ(DecodeSteps(client_a, 9, 1).size(), 1u);
  }
  if (victim != Victim::kPeerDaemon) {
    Client client_b(b->client_options("observer"));
    ExpectHoldsNothing(client_b);
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, TwoNodeKillTest,
                         ::testing::Values(Victim::kPeerDaemon, Victim::kReceivingWorkers,
                                           Victim::kSendingWorkers),
                         [](const ::testing::TestParamInfo<Victim>& param) {
                           switch (param.param) {
                             case Victim::kPeerDaemon: return "PeerDaemon";
                             case Victim::kReceivingWorkers: return "ReceivingWorkers";
                             case Victim::kSendingWorkers: return "SendingWorkers";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace kvp::testing
