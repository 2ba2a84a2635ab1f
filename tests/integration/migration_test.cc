// Disaggregation across pools with real processes on the host backend (docs/design.md §6):
// kvpoold --pools=2 stands in for two GPUs, a prefill worker writes on pool 0, decode workers read
// on pool 1, and sequences move between them as migrate jobs. Outputs after a move are the bits of
// a sequence that never moved; a receiver killed mid-move leaves nothing behind on either pool.
#include <signal.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i * 7;
  return t;
}

// kvpoold with two host pools: a prefill worker on pool 0, a decode worker on each pool.
std::unique_ptr<ServiceProcesses> StartTwoPools(std::vector<std::string> flags = {}) {
  ServiceOptions options = TwoPoolOptions();
  options.daemon_flags.insert(options.daemon_flags.end(), flags.begin(), flags.end());
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// `steps` decode steps of `seq` (tokens 11, 12, ...), every layer's output.
std::vector<DecodeStepResult> DecodeSteps(Client& client, uint64_t seq, int steps) {
  std::vector<DecodeStepResult> out;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<DecodeResult> r =
        client.Decode({DecodeStepRequest{seq, 11 + i, std::nullopt, nullptr, nullptr}});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return out;
    out.push_back(r->steps.at(0));
  }
  return out;
}

void ExpectSameOutputs(const std::vector<DecodeStepResult>& a,
                       const std::vector<DecodeStepResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].length, b[i].length);
    EXPECT_EQ(a[i].out, b[i].out) << "step " << i << ": not bit-identical";
    EXPECT_EQ(a[i].topk, b[i].topk) << "step " << i;
  }
}

// Both pools hold nothing but cache.
void ExpectNothingHeld(Client& client) {
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->pools.size(), 2u);
  for (const PoolState& p : stats->pools) {
    EXPECT_EQ(p.blocks_reserved, 0u) << "pool " << p.index;
    EXPECT_EQ(p.blocks_used, 0u) << "pool " << p.index;
  }
}

ClientOptions InNamespace(ClientOptions o, const std::string& ns) {
  o.cache_namespace = ns;  // no prefix hits across namespaces: each sequence has its own blocks
  return o;
}

TEST(MigrationTest, PrefilledOnOnePoolDecodedOnTheOtherGivesTheSameBits) {
  auto service = StartTwoPools();
  ASSERT_NE(service, nullptr);
  Client stay(InNamespace(service->client_options("stay"), "stay"));
  Client move(InNamespace(service->client_options("move"), "move"));
  const std::vector<int32_t> prompt = Tokens(300, 5);  // 4 full blocks of 64 and a partial one

  absl::StatusOr<PrefillResult> here = stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0});
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_EQ(here->pool, 0u);
  EXPECT_FALSE(here->migration.has_value());
  absl::StatusOr<PrefillResult> there =
      move.Prefill(2, prompt, nullptr, nullptr, {.pool = 0, .decode_pool = 1});
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_EQ(there->pool, 1u);
  ASSERT_TRUE(there->migration.has_value());
  EXPECT_TRUE(there->migration->error.ok()) << there->migration->error;
  EXPECT_EQ(there->migration->transport, wire::Transport::HOST);
  EXPECT_EQ(there->migration->blocks_moved, 5u);
  EXPECT_GT(there->migration->bytes, 0u);

  absl::StatusOr<PoolStats> stats = move.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pools.at(0).blocks_used, 5u) << "sequence 1 only";
  EXPECT_EQ(stats->pools.at(1).blocks_used, 5u) << "sequence 2";
  ExpectSameOutputs(DecodeSteps(stay, 1, 3), DecodeSteps(move, 2, 3));

  // Moved back for rebalancing, it decodes on pool 0 as before.
  absl::StatusOr<MigrationResult> back = move.Migrate(2, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->from_pool, 1u);
  EXPECT_EQ(back->length, 303);
  ExpectSameOutputs(DecodeSteps(stay, 1, 2), DecodeSteps(move, 2, 2));
  ASSERT_TRUE(stay.Release(1).ok());
  ASSERT_TRUE(move.Release(2).ok());
  ExpectNothingHeld(move);
}

TEST(MigrationTest, AFragmentedBlockTableMovesWhole) {
  auto service = StartTwoPools();
  ASSERT_NE(service, nullptr);
  Client a(InNamespace(service->client_options("a"), "a"));
  Client b(InNamespace(service->client_options("b"), "b"));
  // Chunked prefills of two sequences in turn interleave their blocks on pool 0.
  for (int chunk = 0; chunk < 4; ++chunk) {
    const std::vector<int32_t> tokens = Tokens(64, 1000 + chunk * 64 * 7);
    ASSERT_TRUE(a.Prefill(1, tokens, nullptr, nullptr, {.pool = 0}).ok());
    ASSERT_TRUE(b.Prefill(2, tokens, nullptr, nullptr, {.pool = 0}).ok());
  }
  absl::StatusOr<MigrationResult> moved = b.Migrate(2, 1);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->blocks_moved, 4u);
  ExpectSameOutputs(DecodeSteps(a, 1, 4), DecodeSteps(b, 2, 4));
  ASSERT_TRUE(a.Release(1).ok());
  ASSERT_TRUE(b.Release(2).ok());
  ExpectNothingHeld(a);
}

// A long prefill decoded elsewhere is written in slices whose full blocks stream to the decode
// pool while the next slice is written: synthetic and client tensors alike decode to the bits of
// a sequence written whole that never moved.
TEST(MigrationTest, ASlicedPrefillStreamedToTheDecodePoolGivesTheSameBits) {
  auto service = StartTwoPools();
  ASSERT_NE(service, nullptr);
  Client stay(InNamespace(service->client_options("a"), "a"));
  Client move(InNamespace(service->client_options("b"), "b"));
  const absl::StatusOr<PoolHealth> h = stay.Health();
  ASSERT_TRUE(h.ok()) << h.status();
  const int block = h->spec.block_size;
  // 21 blocks, slices of 2 (small enough that kvpoold's handling of the tensors stays well inside
  // the workers' lease in a sanitizer build).
  const std::vector<int32_t> prompt = Tokens(20 * block + 17, 5);
  const TokenActivations tensors = RandomActivations(h->spec, prompt.size(), 7);
  ASSERT_TRUE(stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  ASSERT_TRUE(stay.Prefill(3, prompt, &tensors, &h->spec, {.pool = 0}).ok());
  for (const auto& [seq, act] : {std::pair<uint64_t, const TokenActivations*>{2, nullptr},
                                 {4, &tensors}}) {
    const absl::StatusOr<PrefillResult> r =
        move.Prefill(seq, prompt, act, act != nullptr ? &h->spec : nullptr,
                     {.pool = 0, .decode_pool = 1, .chunk_tokens = 2 * block});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->pool, 1u);
    EXPECT_EQ(r->length, static_cast<int64_t>(prompt.size()));
    ASSERT_TRUE(r->migration.has_value());
    EXPECT_TRUE(r->migration->error.ok()) << r->migration->error;
    EXPECT_EQ(r->migration->blocks_moved, 21u);
    EXPECT_EQ(r->migration->blocks_shared, 0u);
    // 11 slices of which 10 finish blocks the receiver streams (it is idle): most move early.
    EXPECT_GT(r->migration->streamed_blocks, 0u);
    EXPECT_LE(r->migration->streamed_blocks, 20u) << "the partial last block moves at the end";
  }
  ExpectSameOutputs(DecodeSteps(stay, 1, 2), DecodeSteps(move, 2, 2));
  ExpectSameOutputs(DecodeSteps(stay, 3, 2), DecodeSteps(move, 4, 2));
  for (uint64_t seq : {1, 3}) ASSERT_TRUE(stay.Release(seq).ok());
  for (uint64_t seq : {2, 4}) ASSERT_TRUE(move.Release(seq).ok());
  ExpectNothingHeld(stay);
}

// An engine's chunked prefill: continued prefills of one sequence, each answered once written on
// pool 0 while its blocks stream to pool 1, then the last one, which moves only what is left.
TEST(MigrationTest, AnEnginesChunkedPrefillStreamsAndGivesTheSameBits) {
  auto service = StartTwoPools();
  ASSERT_NE(service, nullptr);
  Client stay(InNamespace(service->client_options("a"), "a"));
  Client move(InNamespace(service->client_options("b"), "b"));
  const absl::StatusOr<PoolHealth> h = stay.Health();
  ASSERT_TRUE(h.ok()) << h.status();
  const int block = h->spec.block_size;
  const std::vector<int32_t> prompt = Tokens(20 * block + 5, 9);
  ASSERT_TRUE(stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  // Four chunks of five blocks continued, then the last five tokens.
  for (int chunk = 0; chunk < 4; ++chunk) {
    const std::span<const int32_t> tokens(prompt.data() + chunk * 5 * block, 5 * block);
    const absl::StatusOr<PrefillResult> r = move.Prefill(
        2, tokens, nullptr, nullptr, {.pool = 0, .decode_pool = 1, .continued = true});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->pool, 0u) << "it lives on pool 0 until the last chunk";
    EXPECT_FALSE(r->migration.has_value());
  }
  const absl::StatusOr<PrefillResult> last =
      move.Prefill(2, std::span<const int32_t>(prompt).subspan(20 * block), nullptr, nullptr,
                   {.pool = 0, .decode_pool = 1});
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->pool, 1u);
  EXPECT_EQ(last->length, static_cast<int64_t>(prompt.size()));
  ASSERT_TRUE(last->migration.has_value());
  EXPECT_TRUE(last->migration->error.ok()) << last->migration->error;
  EXPECT_EQ(last->migration->blocks_moved, 21u);
  // At least the first chunk's blocks moved while later ones were written (the last chunk waits
  // for the stream move in flight); what had not streamed by then moves with the last.
  EXPECT_GE(last->migration->streamed_blocks, 5u);
  EXPECT_LE(last->migration->streamed_blocks, 20u);
  ExpectSameOutputs(DecodeSteps(stay, 1, 2), DecodeSteps(move, 2, 2));
  ASSERT_TRUE(stay.Release(1).ok());
  ASSERT_TRUE(move.Release(2).ok());
  ExpectNothingHeld(stay);
}

// The receiver of a stream killed while the prefill is written: the prefill still commits on its
// pool, its move says why it did not happen, and neither pool keeps a staged block.
TEST(MigrationTest, AStreamsReceiverKilledMidPrefillLeavesTheSequenceOnItsSource) {
  auto service = StartTwoPools({"--arena_mib=256"});
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("streamed"));
  Client reference(InNamespace(service->client_options("reference"), "reference"));
  const absl::StatusOr<PoolHealth> h = client.Health();
  ASSERT_TRUE(h.ok()) << h.status();
  const std::vector<int32_t> prompt = Tokens(100 * h->spec.block_size, 3);
  ASSERT_TRUE(reference.Prefill(2, prompt, nullptr, nullptr, {.pool = 0}).ok());
  // Stopped, the receiver holds the first stream move without running it; killed, it never
  // reports, and its lease runs out while (or after) the slices are written.
  const pid_t receiver = service->decode_workers().at(1);
  ASSERT_EQ(::kill(receiver, SIGSTOP), 0);
  EnvelopeBuilder m = client.NewRequest();
  Client::BuildPrefill(m, 1, prompt, nullptr, nullptr, "",
                       {.pool = 0, .decode_pool = 1, .chunk_tokens = h->spec.block_size});
  ASSERT_TRUE(client.Send(m).ok());
  bool staged = false;
  for (int i = 0; i < 200 && !staged; ++i) {
    absl::StatusOr<PoolStats> stats = client.Stats();
    ASSERT_TRUE(stats.ok());
    staged = stats->pools.at(1).blocks_reserved > 0;
    if (!staged) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(staged) << "no block was ever staged on pool 1";
  service->Stop(receiver, SIGKILL);
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(60'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  const absl::StatusOr<PrefillResult> r = PrefillResultOf(**reply);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pool, 0u) << "written on pool 0, and still there";
  EXPECT_EQ(r->length, static_cast<int64_t>(prompt.size()));
  ASSERT_TRUE(r->migration.has_value());
  EXPECT_FALSE(r->migration->error.ok());
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pools.at(1).blocks_reserved, 0u);
  EXPECT_EQ(stats->pools.at(1).blocks_used, 0u);
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));
  // With a receiver again it moves whole.
  service->StartWorker("decode", 1);
  ASSERT_TRUE(service->WaitForWorkers(3, 20'000).ok());
  absl::StatusOr<MigrationResult> landed = client.Migrate(1, 1);
  ASSERT_TRUE(landed.ok()) << landed.status();
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));
  ASSERT_TRUE(client.Release(1).ok());
  ASSERT_TRUE(reference.Release(2).ok());
  ExpectNothingHeld(client);
}

void ThirtyTwoConcurrentMigrationsLand(const std::vector<std::string>& flags) {
  std::vector<std::string> all = {"--arena_mib=128"};
  all.insert(all.end(), flags.begin(), flags.end());
  auto service = StartTwoPools(all);
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("many"));
  constexpr int kSequences = 32;
  for (int i = 0; i < kSequences; ++i) {
    ASSERT_TRUE(client.Prefill(100 + i, Tokens(130, i * 1000), nullptr, nullptr, {.pool = 0}).ok());
  }
  for (int i = 0; i < kSequences; ++i) {
    EnvelopeBuilder m = client.NewRequest();
    auto r = m.envelope().getBody().initMigrate();
    r.setSequence(100 + i);
    r.setToPool(1);
    ASSERT_TRUE(client.Send(m).ok());
  }
  for (int i = 0; i < kSequences; ++i) {
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(60'000);
    ASSERT_TRUE(reply.ok()) << reply.status();
    absl::StatusOr<MigrationResult> m = MigrationResultOf(**reply);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->to_pool, 1u);
  }
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pools.at(0).blocks_used, 0u);
  EXPECT_EQ(stats->pools.at(1).blocks_used, 3u * kSequences);
  EXPECT_EQ(stats->pools.at(1).sequences, static_cast<uint32_t>(kSequences));
  for (int i = 0; i < kSequences; ++i) ASSERT_TRUE(client.Release(100 + i).ok());
  ExpectNothingHeld(client);
}

TEST(MigrationTest, ThirtyTwoConcurrentMigrationsAllLand) { ThirtyTwoConcurrentMigrationsLand({}); }

TEST(MigrationTest, ThirtyTwoConcurrentSocketMigrationsAllLand) {
  ThirtyTwoConcurrentMigrationsLand({"--transport=socket"});
}

// Sends a Migrate of `seq` to pool 1 and waits until its blocks are reserved there.
void StartMoveToPool1(Client& client, uint64_t seq) {
  EnvelopeBuilder m = client.NewRequest();
  auto r = m.envelope().getBody().initMigrate();
  r.setSequence(seq);
  r.setToPool(1);
  ASSERT_TRUE(client.Send(m).ok());
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<PoolStats> stats = client.Stats();
    ASSERT_TRUE(stats.ok());
    if (stats->pools.at(1).blocks_reserved > 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FAIL() << "the move never reserved its blocks";
}

// The reply to a move that failed: ABORTED, the sequence still on pool 0, nothing on pool 1.
void ExpectAbortedOnPool0(Client& client) {
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(30'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  const absl::Status moved = MigrationResultOf(**reply).status();
  EXPECT_TRUE(absl::IsAborted(moved)) << moved;
  EXPECT_THAT(moved.message(), ::testing::HasSubstr("still lives in pool 0"));
  absl::StatusOr<PoolStats> after = client.Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->pools.at(1).blocks_reserved, 0u);
  EXPECT_EQ(after->pools.at(1).blocks_used, 0u);
}

TEST(MigrationTest, AReceiverKilledMidMoveLeavesTheSequenceOnItsSourceAndNothingBehind) {
  auto service = StartTwoPools({"--arena_mib=256"});
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("killed"));
  const std::vector<int32_t> prompt = Tokens(4000, 3);
  ASSERT_TRUE(client.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  ASSERT_EQ(DecodeSteps(client, 1, 1).size(), 1u);
  const pid_t receiver = service->decode_workers().at(1);

  // Stopped, the receiver holds the migrate job without running it; killed, it never reports.
  ASSERT_EQ(::kill(receiver, SIGSTOP), 0);
  EnvelopeBuilder m = client.NewRequest();
  auto r = m.envelope().getBody().initMigrate();
  r.setSequence(1);
  r.setToPool(1);
  ASSERT_TRUE(client.Send(m).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  absl::StatusOr<PoolStats> during = client.Stats();
  ASSERT_TRUE(during.ok());
  EXPECT_GT(during->pools.at(1).blocks_reserved, 0u) << "reserved on the destination";
  EXPECT_EQ(client.Release(1).status().code(), absl::StatusCode::kFailedPrecondition)
      << "busy while it moves";
  service->Stop(receiver, SIGKILL);
  ExpectAbortedOnPool0(client);
  // Still readable where it was: the next step equals a sequence that never tried to move.
  Client reference(InNamespace(service->client_options("reference"), "reference"));
  ASSERT_TRUE(reference.Prefill(2, prompt, nullptr, nullptr, {.pool = 0}).ok());
  ASSERT_EQ(DecodeSteps(reference, 2, 1).size(), 1u);  // the step sequence 1 took before
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));

  // A new receiver on pool 1, then the source pool's decode worker killed while the move runs:
  // the move does not need it.
  service->StartWorker("decode", 1);
  ASSERT_TRUE(service->WaitForWorkers(3, 20'000).ok());
  EnvelopeBuilder again = client.NewRequest();
  auto r2 = again.envelope().getBody().initMigrate();
  r2.setSequence(1);
  r2.setToPool(1);
  ASSERT_TRUE(client.Send(again).ok());
  service->Stop(service->decode_workers().at(0), SIGKILL);
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(30'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  absl::StatusOr<MigrationResult> landed = MigrationResultOf(**reply);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->to_pool, 1u);
  ASSERT_TRUE(client.Release(1).ok());
  ASSERT_TRUE(reference.Release(2).ok());
  ExpectNothingHeld(client);
}

TEST(MigrationTest, BadPoolsGetTypedErrors) {
  auto service = StartTwoPools();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("bad"));
  const std::vector<int32_t> prompt = Tokens(70, 1);
  EXPECT_EQ(client.Prefill(1, prompt, nullptr, nullptr, {.pool = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Prefill(1, prompt, nullptr, nullptr, {.pool = 1}).status().code(),
            absl::StatusCode::kUnavailable) << "pool 1 has no prefill worker";
  EXPECT_EQ(client.Prefill(1, prompt, nullptr, nullptr, {.pool = 0, .decode_pool = 7})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client.Prefill(1, prompt).ok());  // placed by kvpoold: pool 0 has the prefill worker
  EXPECT_EQ(client.Migrate(1, 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Migrate(99, 1).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<PoolHealth> health = client.Health();
  ASSERT_TRUE(health.ok());
  ASSERT_EQ(health->pools.size(), 2u);
  EXPECT_EQ(health->pools[0].prefill_workers, 1u);
  EXPECT_EQ(health->pools[1].decode_workers, 1u);
  ASSERT_TRUE(client.Release(1).ok());
  ExpectNothingHeld(client);
}

// ---- Paired moves over sockets: a sender on the source pool, a receiver on the destination ----

TEST(MigrationTest, OverASocketLinkContiguousAndFragmentedTablesGiveTheSameBits) {
  auto service = StartTwoPools({"--transport=socket"});
  ASSERT_NE(service, nullptr);
  Client stay(InNamespace(service->client_options("stay"), "stay"));
  Client move(InNamespace(service->client_options("move"), "move"));
  Client other(InNamespace(service->client_options("other"), "other"));
  const std::vector<int32_t> prompt = Tokens(300, 5);
  ASSERT_TRUE(stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  absl::StatusOr<PrefillResult> there =
      move.Prefill(2, prompt, nullptr, nullptr, {.pool = 0, .decode_pool = 1});
  ASSERT_TRUE(there.ok()) << there.status();
  ASSERT_TRUE(there->migration.has_value());
  EXPECT_TRUE(there->migration->error.ok()) << there->migration->error;
  EXPECT_EQ(there->migration->transport, wire::Transport::SOCKET);
  EXPECT_EQ(there->migration->blocks_moved, 5u);
  ExpectSameOutputs(DecodeSteps(stay, 1, 3), DecodeSteps(move, 2, 3));

  // Interleaved chunked prefills fragment sequence 4's table on pool 0.
  for (int chunk = 0; chunk < 4; ++chunk) {
    const std::vector<int32_t> tokens = Tokens(64, 1000 + chunk * 64 * 7);
    ASSERT_TRUE(stay.Prefill(3, tokens, nullptr, nullptr, {.pool = 0}).ok());
    ASSERT_TRUE(other.Prefill(4, tokens, nullptr, nullptr, {.pool = 0}).ok());
  }
  absl::StatusOr<MigrationResult> moved = other.Migrate(4, 1);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->transport, wire::Transport::SOCKET);
  EXPECT_EQ(moved->blocks_moved, 4u);
  ExpectSameOutputs(DecodeSteps(stay, 3, 4), DecodeSteps(other, 4, 4));
  for (auto [client, seq] : {std::pair{&stay, 1}, {&move, 2}, {&stay, 3}, {&other, 4}}) {
    ASSERT_TRUE(client->Release(seq).ok());
  }
  ExpectNothingHeld(stay);
}

TEST(MigrationTest, KillingTheSocketReceiverOrSenderMidTransferLeavesNothingBehind) {
  // Senders paced to 4 MiB/s: the ~13 MiB sequence is mid-transfer for about three seconds.
  ServiceOptions options = TwoPoolOptions();
  options.daemon_flags.insert(options.daemon_flags.end(),
                              {"--arena_mib=256", "--transport=socket"});
  options.worker_flags.push_back("--transfer_max_mib_per_s=4");
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> started = ServiceProcesses::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  ServiceProcesses& service = **started;
  Client client(service.client_options("killed"));
  Client reference(InNamespace(service.client_options("reference"), "reference"));
  const std::vector<int32_t> prompt = Tokens(4000, 3);
  ASSERT_TRUE(client.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  ASSERT_TRUE(reference.Prefill(2, prompt, nullptr, nullptr, {.pool = 0}).ok());

  // The receiver (pool 1's only worker) killed half-way.
  StartMoveToPool1(client, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  service.Stop(service.decode_workers().at(1), SIGKILL);
  ExpectAbortedOnPool0(client);
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));

  // A new receiver; then both workers of pool 0, the sender among them, killed half-way.
  service.StartWorker("decode", 1);
  ASSERT_TRUE(service.WaitForWorkers(3, 20'000).ok());
  StartMoveToPool1(client, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  service.Stop(service.prefill_workers().at(0), SIGKILL);
  service.Stop(service.decode_workers().at(0), SIGKILL);
  ExpectAbortedOnPool0(client);
  // Still readable on pool 0 once it has a decode worker again: the same bits as the reference.
  service.StartWorker("decode", 0);
  ASSERT_TRUE(service.WaitForWorkers(2, 20'000).ok());
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));

  // And it moves whole once nobody is killed.
  absl::StatusOr<MigrationResult> landed = client.Migrate(1, 1);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->transport, wire::Transport::SOCKET);
  ExpectSameOutputs(DecodeSteps(client, 1, 1), DecodeSteps(reference, 2, 1));
  ASSERT_TRUE(client.Release(1).ok());
  ASSERT_TRUE(reference.Release(2).ok());
  ExpectNothingHeld(client);
}

TEST(MigrationTest, ATransportThatCannotMoveThesePoolsIsRefused) {
  auto service = StartTwoPools({"--transport=peer_copy"});
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("refused"));
  const absl::Status refused =
      client.Prefill(1, Tokens(70, 1), nullptr, nullptr, {.pool = 0, .decode_pool = 1}).status();
  EXPECT_TRUE(absl::IsUnimplemented(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("cuda pools only"));
  ExpectNothingHeld(client);
}

}  // namespace
}  // namespace kvp::testing
