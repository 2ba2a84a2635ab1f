// kvpoold restarts without losing the cache (docs/design.md §10), with real processes on the host
// backend: kvpoold logs its state under --state_dir and keeps its arena's chunks in a stand-in
// for systemd's fd store; after SIGKILL, SIGTERM or a crash at any step of any request, the next
// kvpoold adopts the chunks, replays the log, and every sequence a client was told exists
// decodes exactly as a fork of it did before the crash, with no block leaked or owned twice.
#include <signal.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

constexpr int32_t kProbeToken = 977;

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i * 7;
  return t;
}

// Two pools (for migrations), a prefill worker on pool 0 and a decode worker on each: host pools,
// or with KVPOOL_TEST_BACKEND=cuda two pools on GPU 0.
std::unique_ptr<ServiceProcesses> StartKeepingState(bool fd_store = true) {
  const char* backend = std::getenv("KVPOOL_TEST_BACKEND");
  ServiceOptions options =
      TwoPoolOptions(backend != nullptr && backend[0] != '\0' ? backend : "host");
  options.keep_state = true;
  options.fd_store = fd_store;
  options.daemon_flags.push_back("--recovery_grace_ms=60000");
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// What a sequence decodes to: a fork of it decoded one step with the probe token (the sequence
// itself is left as it was). NOT_FOUND when it does not exist.
absl::StatusOr<DecodeStepResult> Probe(Client& client, uint64_t seq, uint64_t scratch) {
  if (absl::StatusOr<uint32_t> f = client.Fork(seq, scratch); !f.ok()) return f.status();
  absl::StatusOr<DecodeResult> r =
      client.Decode({DecodeStepRequest{scratch, kProbeToken, std::nullopt, nullptr, nullptr}});
  (void)client.Release(scratch);
  if (!r.ok()) return r.status();
  return r->steps.at(0);
}

// Calls `f` until kvpoold answers (it may be restarting).
template <typename F>
auto Retry(F f) {
  auto r = f();
  for (int i = 0; i < 100 && absl::IsUnavailable(r.status()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r = f();
  }
  return r;
}

void ExpectSameDecode(const DecodeStepResult& a, const DecodeStepResult& b, uint64_t seq) {
  EXPECT_EQ(a.length, b.length) << "sequence " << seq;
  EXPECT_EQ(a.out, b.out) << "sequence " << seq << " decodes to other bits after the restart";
  EXPECT_EQ(a.topk, b.topk) << "sequence " << seq;
}

// Once the last kvpoold's reservations are out of quarantine, nothing is held but `sequences`.
void ExpectOnlyTheseHeld(Client& client, size_t sequences) {
  absl::StatusOr<PoolStats> s;
  for (int i = 0; i < 100; ++i) {
    s = Retry([&] { return client.Stats(); });
    ASSERT_TRUE(s.ok()) << s.status();
    if (s->blocks_reserved == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(s->blocks_reserved, 0u) << "reservations of the crashed kvpoold were never freed";
  EXPECT_EQ(s->sequences, sequences);
  if (sequences == 0) {
    EXPECT_EQ(s->blocks_used, 0u) << "blocks leaked";
  }
}

absl::Status Restart(ServiceProcesses& service, const std::vector<std::string>& flags = {}) {
  if (absl::Status s = service.RestartDaemon(flags); !s.ok()) return s;
  return service.WaitForWorkers(3, 20'000);
}

TEST(RestartTest, SigkillKeepsEverySequenceBitForBit) {
  auto service = StartKeepingState();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("keeper"));
  ASSERT_TRUE(client.Prefill(1, Tokens(300, 5)).ok());
  ASSERT_TRUE(client.Prefill(2, Tokens(70, 9)).ok());
  ASSERT_TRUE(client.Migrate(2, 1).ok());
  ASSERT_TRUE(client.Fork(1, 3).ok());
  std::map<uint64_t, DecodeStepResult> before;
  for (uint64_t seq : {1, 2, 3}) {
    absl::StatusOr<DecodeStepResult> p = Probe(client, seq, 100 + seq);
    ASSERT_TRUE(p.ok()) << p.status();
    before[seq] = *p;
  }
  EXPECT_EQ(service->Stop(service->daemon(), SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(Restart(*service).ok());

  for (uint64_t seq : {1, 2, 3}) {
    absl::StatusOr<DecodeStepResult> p = Retry([&] { return Probe(client, seq, 100 + seq); });
    ASSERT_TRUE(p.ok()) << "sequence " << seq << ": " << p.status();
    ExpectSameDecode(before[seq], *p, seq);
  }
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->recovery.state_dir);
  EXPECT_EQ(stats->recovery.sequences, 3u);
  EXPECT_GT(stats->recovery.blocks, 0u);
  ASSERT_EQ(stats->pools.size(), 2u);
  EXPECT_EQ(stats->pools[1].sequences, 1u) << "sequence 2 lives in pool 1, as before";
  // The recovered sequences take new tokens, and prefix hits still find their blocks.
  ASSERT_TRUE(client.Decode({DecodeStepRequest{1, 4, std::nullopt, nullptr, nullptr}}).ok());
  absl::StatusOr<PrefillResult> again = client.Prefill(4, Tokens(300, 5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->prefix_hit_tokens, 0);
  for (uint64_t seq : {1, 2, 3, 4}) ASSERT_TRUE(client.Release(seq).ok());
  ExpectOnlyTheseHeld(client, 0);
}

TEST(RestartTest, AnUpgradeBySigtermKeepsTheCache) {
  auto service = StartKeepingState();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("upgrader"));
  ASSERT_TRUE(client.Prefill(7, Tokens(200, 3)).ok());
  absl::StatusOr<DecodeStepResult> before = Probe(client, 7, 70);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(service->Stop(service->daemon(), SIGTERM), 0);  // drains, exits 0
  ASSERT_TRUE(Restart(*service).ok());
  absl::StatusOr<DecodeStepResult> after = Retry([&] { return Probe(client, 7, 70); });
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameDecode(*before, *after, 7);
}

TEST(RestartTest, WithoutAnFdStoreTheWorkersHandTheArenaBack) {
  auto service = StartKeepingState(/*fd_store=*/false);
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("k8s"));
  ASSERT_TRUE(client.Prefill(1, Tokens(150, 4)).ok());
  ASSERT_TRUE(client.Prefill(2, Tokens(90, 6)).ok());
  ASSERT_TRUE(client.Migrate(2, 1).ok());
  absl::StatusOr<DecodeStepResult> one = Probe(client, 1, 10), two = Probe(client, 2, 20);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(service->Stop(service->daemon(), SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(Restart(*service).ok());
  absl::StatusOr<DecodeStepResult> one_after = Retry([&] { return Probe(client, 1, 10); });
  absl::StatusOr<DecodeStepResult> two_after = Retry([&] { return Probe(client, 2, 20); });
  ASSERT_TRUE(one_after.ok()) << one_after.status();
  ASSERT_TRUE(two_after.ok()) << two_after.status();
  ExpectSameDecode(*one, *one_after, 1);
  ExpectSameDecode(*two, *two_after, 2);
  // And again: the arena handed back is handed out, and back, once more.
  EXPECT_EQ(service->Stop(service->daemon(), SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(Restart(*service).ok());
  one_after = Retry([&] { return Probe(client, 1, 10); });
  ASSERT_TRUE(one_after.ok()) << one_after.status();
  ExpectSameDecode(*one, *one_after, 1);
}

TEST(RestartTest, WithoutItsChunksKvpooldStartsEmptyAndSaysSo) {
  auto service = StartKeepingState();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("loser"));
  ASSERT_TRUE(client.Prefill(8, Tokens(100, 3)).ok());
  service->Stop(service->daemon(), SIGKILL);
  service->fd_store()->Drain();
  service->fd_store()->Clear();  // as systemd does when the service is stopped, not restarted
  // No worker holds the arena either (they are restarted too).
  const std::vector<pid_t> workers = [&] {
    std::vector<pid_t> all = service->prefill_workers();
    all.insert(all.end(), service->decode_workers().begin(), service->decode_workers().end());
    return all;
  }();
  for (pid_t w : workers) service->Stop(w, SIGKILL);
  service->StartWorker("prefill", 0);
  service->StartWorker("decode", 0);
  service->StartWorker("decode", 1);
  ASSERT_TRUE(Restart(*service, {"--recovery_wait_ms=500"}).ok());
  absl::StatusOr<DecodeStepResult> p = Retry([&] { return Probe(client, 8, 80); });
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->recovery.sequences, 0u);
  // A new arena, and its chunks are in the store again for the next restart.
  ASSERT_TRUE(client.Prefill(9, Tokens(100, 3)).ok());
  absl::StatusOr<DecodeStepResult> before = Probe(client, 9, 90);
  ASSERT_TRUE(before.ok());
  service->Stop(service->daemon(), SIGKILL);
  ASSERT_TRUE(Restart(*service).ok());
  absl::StatusOr<DecodeStepResult> after = Retry([&] { return Probe(client, 9, 90); });
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameDecode(*before, *after, 9);
}

TEST(RestartTest, AnotherPoolSpecStartsEmpty) {
  auto service = StartKeepingState();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("changer"));
  ASSERT_TRUE(client.Prefill(5, Tokens(100, 3)).ok());
  service->Stop(service->daemon(), SIGKILL);
  ASSERT_TRUE(Restart(*service, {"--block_size=32"}).ok());
  absl::StatusOr<DecodeStepResult> p = Retry([&] { return Probe(client, 5, 50); });
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
}

// ---- Crash points ----

// What the test client was told: each sequence's probe before the crash. A request whose reply
// never came may or may not have happened; the check afterwards accepts either, but never a
// half-done one.
struct Told {
  std::map<uint64_t, DecodeStepResult> probes;
};

const char* const kSteps[] = {"receive", "log", "send"};
const char* const kReceived[] = {"prefill", "decode", "fork",     "release",
                                 "migrate", "jobDone", "register", "*"};
const char* const kSent[] = {"prefillJob",  "decodeJob",  "migrateJob",   "prefillReply",
                             "decodeReply", "forkReply",  "releaseReply", "migrateReply", "*"};

// Every step of every kind in turn (the first time each is reached), then random ones.
std::vector<std::string> SystematicCrashPoints() {
  std::vector<std::string> points;
  for (const char* step : {"receive", "log"}) {
    for (const char* kind : kReceived) {
      if (std::string(kind) != "*") points.push_back(absl::StrCat(step, ":", kind, ":1"));
    }
  }
  points.push_back("log:tick:1");
  for (const char* kind : kSent) {
    if (std::string(kind) != "*") points.push_back(absl::StrCat("send:", kind, ":1"));
  }
  return points;
}

std::string RandomCrashPoint(std::mt19937_64& rng) {
  const std::string step = kSteps[rng() % 3];
  std::string kind = step == "send" ? kSent[rng() % std::size(kSent)]
                                    : kReceived[rng() % std::size(kReceived)];
  if (step == "log" && rng() % 8 == 0) kind = "tick";  // a tick's changes: reaps, dispatches
  return absl::StrCat(step, ":", kind, ":", 1 + rng() % 4);
}

TEST(RestartTest, CrashPointsKeepWhatClientsWereTold) {
  const char* env = std::getenv("KVPOOL_CRASH_POINTS");
  const int points = env != nullptr ? std::atoi(env) : 200;
  const char* seed_env = std::getenv("KVPOOL_CRASH_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20261201;
  std::mt19937_64 rng(seed);
  auto service = StartKeepingState();
  ASSERT_NE(service, nullptr);
  ClientOptions o = service->client_options("crash-tester");
  o.timeout_ms = 1500;  // a request to a kvpoold that just died waits this long
  Client client(o);
  Told told;
  uint64_t next_seq = 1;
  const uint64_t scratch = 1'000'000;
  int crashed = 0;
  const std::vector<std::string> in_turn = SystematicCrashPoints();
  for (int point = 0; point < points; ++point) {
    const std::string crash_at = point < static_cast<int>(in_turn.size()) ? in_turn[point]
                                                                          : RandomCrashPoint(rng);
    SCOPED_TRACE(absl::StrCat("crash point ", point, " (seed ", seed, "): ", crash_at));
    service->Stop(service->daemon(), SIGKILL);
    // The point may be reached before the workers are back (a registration): then the requests
    // below find no kvpoold, which is what a crash there means to a client.
    (void)Restart(*service, {absl::StrCat("--crash_at=", crash_at)});
    // A few random requests; each success updates what the client was told.
    std::optional<uint64_t> uncertain;  // the sequence of the request that got no answer
    for (int op = 0; op < 8 && !uncertain.has_value(); ++op) {
      if (!service->DaemonRunning()) {
        uncertain = 0;  // crashed between requests
        break;
      }
      const int kind = told.probes.empty() ? 0 : static_cast<int>(rng() % 5);
      auto pick = [&] {
        auto it = told.probes.begin();
        std::advance(it, rng() % told.probes.size());
        return it->first;
      };
      uint64_t seq = 0;
      absl::Status status;
      if (kind == 0 || told.probes.size() < 2) {
        seq = next_seq++;
        status = client.Prefill(seq, Tokens(1 + static_cast<int>(rng() % 200), seq)).status();
      } else if (kind == 1) {
        seq = pick();
        status = client.Decode({DecodeStepRequest{seq, 3, std::nullopt, nullptr, nullptr}}).status();
      } else if (kind == 2) {
        seq = next_seq++;
        status = client.Fork(pick(), seq).status();
      } else if (kind == 3) {
        seq = pick();
        status = client.Release(seq).status();
        if (status.ok()) told.probes.erase(seq);
        if (status.ok()) continue;
      } else {
        seq = pick();
        status = client.Migrate(seq, static_cast<uint32_t>(rng() % 2)).status();
      }
      if (!status.ok()) {
        uncertain = seq;
        break;
      }
      absl::StatusOr<DecodeStepResult> p = Probe(client, seq, scratch);
      if (!p.ok()) {
        uncertain = seq;
        break;
      }
      told.probes[seq] = *p;
    }
    if (uncertain.has_value()) ++crashed;
    // Whatever happened, kvpoold is killed now (if the point was not reached) and restarted.
    service->Stop(service->daemon(), SIGKILL);
    ASSERT_TRUE(Restart(*service).ok());
    (void)Retry([&] { return client.Release(scratch); });  // a probe's fork may have survived
    for (const auto& [seq, before] : told.probes) {
      absl::StatusOr<DecodeStepResult> after = Retry([&] { return Probe(client, seq, scratch); });
      if (uncertain == seq && !after.ok()) {
        // The request in flight released it, or never made it: either is fine.
        EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound) << after.status();
        continue;
      }
      ASSERT_TRUE(after.ok()) << "sequence " << seq << ": " << after.status();
      if (uncertain == seq && after->length != before.length) {
        EXPECT_EQ(after->length, before.length + 1) << "a decode step half done";
      } else {
        ExpectSameDecode(before, *after, seq);
      }
    }
    if (uncertain.has_value()) {
      // What the unanswered request did, if it did anything, is what the client now knows.
      absl::StatusOr<DecodeStepResult> p = Retry([&] { return Probe(client, *uncertain, scratch); });
      if (p.ok()) {
        told.probes[*uncertain] = *p;
      } else {
        EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
        told.probes.erase(*uncertain);
      }
    }
    if (HasFatalFailure()) return;
    // Keep the pools from filling up.
    while (told.probes.size() > 12) {
      ASSERT_TRUE(Retry([&] { return client.Release(told.probes.begin()->first); }).ok());
      told.probes.erase(told.probes.begin());
    }
  }
  for (const auto& [seq, p] : told.probes) ASSERT_TRUE(client.Release(seq).ok());
  ExpectOnlyTheseHeld(client, 0);
  EXPECT_GT(crashed, points / 4) << "most crash points should be reached";
}

}  // namespace
}  // namespace kvp::testing
