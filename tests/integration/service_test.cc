// kvpoold, workers and clients as real processes on the host backend (docs/design.md §6, §7): the
// full flow against an in-process reference, sharing, bad input, and workers or kvpoold going away.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kernels/synthetic/synthetic_model.h"
#include "kernels/capabilities.h"
#include "protocol/capabilities_codec.h"
#include "protocol/dealer.h"
#include "protocol/status_codec.h"
#include "tests/integration/in_process_reference.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ServiceProcesses> StartOrDie(const ServiceOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

ServiceOptions WithFlags(std::vector<std::string> flags) {
  ServiceOptions options;
  options.daemon_flags = std::move(flags);
  return options;
}

// Every block is free or cached: nothing reserved, nothing referenced.
void ExpectNoBlockHeld(Client& client) {
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks_reserved, 0u);
  EXPECT_EQ(stats->blocks_used, 0u);
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// The pool kinds the flow tests run on: the default KV pool, and an MLA pool (DeepSeek's latent,
// 16 query heads: the fewest sparse MLA decode takes).
const std::vector<std::string> kMlaFlags = {"--pool_kind=mla", "--q_heads=16"};

class ServiceFlowTest : public ::testing::TestWithParam<bool> {
 protected:
  ServiceOptions Options() const { return GetParam() ? WithFlags(kMlaFlags) : ServiceOptions(); }
};

INSTANTIATE_TEST_SUITE_P(PoolKinds, ServiceFlowTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& kind) {
                           return kind.param ? "Mla" : "Kv";
                         });

TEST_P(ServiceFlowTest, OutputsEqualAnInProcessReferenceRun) {
  auto service = StartOrDie(Options());
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("flow"));
  WorkloadConfig config;
  config.sequences = 3;
  config.prompt_tokens = 200;  // three full blocks of 64 and a partial one
  config.decode_steps = 5;
  config.shared_prefix_tokens = 128;
  config.verify_sequences = 1;
  std::vector<DecodeResult> served;
  absl::StatusOr<WorkloadReport> report =
      RunWorkload(client, config, [](const std::string&, int64_t, int64_t) {}, &served);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->needles, 3 * 5 * 2);
  EXPECT_GT(report->needles_found, report->needles / 2);
  EXPECT_LT(report->attention_rel_l2, 0.5);

  absl::StatusOr<PoolHealth> health = client.Health();
  ASSERT_TRUE(health.ok());
  absl::StatusOr<std::vector<std::vector<DecodeStepResult>>> reference =
      RunWorkloadInProcess(config, health->spec, health->model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(served.size(), reference->size());
  for (size_t step = 0; step < served.size(); ++step) {
    ASSERT_EQ(served[step].steps.size(), (*reference)[step].size());
    for (size_t i = 0; i < served[step].steps.size(); ++i) {
      const DecodeStepResult& got = served[step].steps[i];
      const DecodeStepResult& want = (*reference)[step][i];
      EXPECT_EQ(got.sequence, want.sequence);
      EXPECT_EQ(got.length, want.length);
      EXPECT_EQ(got.topk, want.topk) << "step " << step << " sequence " << i;
      EXPECT_EQ(got.lse, want.lse) << "step " << step << " sequence " << i;
      EXPECT_EQ(got.lse.size(), GetParam() ? got.out.size() : 0u);
      ASSERT_EQ(got.out.size(), want.out.size());
      for (size_t l = 0; l < got.out.size(); ++l) {
        ASSERT_EQ(got.out[l].size(), want.out[l].size());
        EXPECT_EQ(0, std::memcmp(got.out[l].data(), want.out[l].data(),
                                 got.out[l].size() * sizeof(float)))
            << "step " << step << " sequence " << i << " layer " << l;
      }
    }
  }
  ExpectNoBlockHeld(client);  // the workload released its sequences
}

TEST(ServiceTest, PrefixHitsReleaseAndForkShare) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("sharing"));
  const std::vector<int32_t> prompt = Tokens(150, 1000);  // 2 full blocks + 22 tokens

  absl::StatusOr<PrefillResult> first = client.Prefill(1, prompt);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->length, 150);
  EXPECT_EQ(first->prefix_hit_tokens, 0);
  absl::StatusOr<PrefillResult> second = client.Prefill(2, prompt);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->prefix_hit_tokens, 128);
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->blocks_used, 4u);  // 2 shared full blocks + 2 partial ones
  EXPECT_EQ(stats->prefix_hit_blocks, 2u);

  absl::StatusOr<uint32_t> shared = client.Fork(1, 3);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(*shared, 3u);
  // A fork and its source decode the same token to the same outputs.
  const DecodeStepRequest on_source{1, 77, NeedleSpec{10, prompt[10], 0.5f}, nullptr, nullptr};
  const DecodeStepRequest on_fork{3, 77, NeedleSpec{10, prompt[10], 0.5f}, nullptr, nullptr};
  absl::StatusOr<DecodeResult> a = client.Decode({on_source});
  absl::StatusOr<DecodeResult> b = client.Decode({on_fork});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->steps[0].length, 151);
  EXPECT_EQ(a->steps[0].out, b->steps[0].out);
  EXPECT_EQ(a->steps[0].topk, b->steps[0].topk);

  for (uint64_t seq : {1, 2, 3}) {
    absl::StatusOr<uint32_t> released = client.Release(seq);
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(*released, 3u);
  }
  ExpectNoBlockHeld(client);
  stats = client.Stats();
  EXPECT_EQ(stats->sequences, 0u);
  EXPECT_GT(stats->blocks_cached, 0u);  // full blocks stay findable by prefix
}

// The synthetic model's activations of `tokens` at positions first.. (what a client with real
// weights would send instead).
TokenActivations SyntheticActivations(const PoolHealth& h, std::span<const int32_t> tokens,
                                      int32_t first) {
  const SyntheticConfig cfg = SyntheticConfigOf(h.model);
  const SyntheticShape shape = SyntheticShapeOf(h.spec, h.model);
  const size_t row = size_t(h.spec.num_kv_heads) * h.spec.InputDim();
  const bool values = !h.spec.mla();  // an MLA pool's tokens are [tokens, 576]: no V
  TokenActivations a;
  for (int l = 0; l < h.spec.num_layers; ++l) {
    a.k.emplace_back(tokens.size() * row);
    if (values) a.v.emplace_back(tokens.size() * row);
    a.index_k.emplace_back(tokens.size() * 128);
    FillSyntheticTokens(cfg, shape, l, tokens, first, a.k.back().data(),
                        values ? a.v.back().data() : nullptr, a.index_k.back().data());
  }
  return a;
}

TEST_P(ServiceFlowTest, ActivationTensorsFromTheClientMatchTheSyntheticModel) {
  auto service = StartOrDie(Options());
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("tensors"));
  absl::StatusOr<PoolHealth> h = client.Health();
  ASSERT_TRUE(h.ok());
  const std::vector<int32_t> prompt = Tokens(100, 500);
  // Sequence 1: synthetic. Sequence 2: other token ids (no prefix hit), the same K/V as tensors.
  ASSERT_TRUE(client.Prefill(1, prompt).ok());
  const TokenActivations act = SyntheticActivations(*h, prompt, 0);
  absl::StatusOr<PrefillResult> with_tensors = client.Prefill(2, Tokens(100, 9000), &act, &h->spec);
  ASSERT_TRUE(with_tensors.ok()) << with_tensors.status();
  EXPECT_EQ(with_tensors->prefix_hit_tokens, 0);

  // One decode step each: synthetic for 1; for 2 the new token's K/V and the queries as tensors.
  const int32_t token = 77;
  const SyntheticConfig cfg = SyntheticConfigOf(h->model);
  const SyntheticShape shape = SyntheticShapeOf(h->spec, h->model);
  const SyntheticNeedle needle{40, prompt[40], 0.6f};
  const TokenActivations step_act = SyntheticActivations(*h, {&token, 1}, 100);
  StepQueries queries;
  for (int l = 0; l < h->spec.num_layers; ++l) {
    const uint64_t seed = SyntheticStepSeed(cfg, token, 100);
    queries.q.emplace_back(size_t(h->model.num_q_heads) * h->spec.InputDim());
    queries.index_q.emplace_back(64 * 128);
    queries.head_weights.emplace_back(64);
    FillSyntheticQuery(cfg, shape, l, seed, &needle, queries.q.back().data());
    FillSyntheticIndexQuery(cfg, l, seed, &needle, queries.index_q.back().data(),
                            queries.head_weights.back().data());
  }
  absl::StatusOr<DecodeResult> a = client.Decode(
      {DecodeStepRequest{1, token, NeedleSpec{needle.position, needle.token, needle.gain}, nullptr,
                         nullptr}});
  absl::StatusOr<DecodeResult> b =
      client.Decode({DecodeStepRequest{2, token, std::nullopt, &step_act, &queries}},
                    wire::OutputLayers::ALL, &h->spec, &h->model);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->steps[0].out, b->steps[0].out);
  EXPECT_EQ(a->steps[0].topk, b->steps[0].topk);
  EXPECT_EQ(a->steps[0].lse, b->steps[0].lse);
  EXPECT_NE(std::count(a->steps[0].topk[0].begin(), a->steps[0].topk[0].end(), 40), 0);

  // Tensors of the other pool kind (encoded for its spec) are refused, naming what is wrong.
  PoolSpec other = h->spec.mla() ? PoolSpec() : MlaPoolSpec(h->spec.num_layers, 64, true);
  other.num_layers = h->spec.num_layers;
  PoolHealth other_health = *h;
  other_health.spec = other;
  const std::vector<int32_t> few = Tokens(10, 20000);
  const TokenActivations wrong = SyntheticActivations(other_health, few, 0);
  absl::StatusOr<PrefillResult> refused = client.Prefill(3, few, &wrong, &other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("k: "));
}

TEST(ServiceTest, EngineAppendCommitAndAbort) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("engine"));
  absl::StatusOr<AppendResult> appended = client.Append(5, Tokens(70, 1));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->slots.size(), 70u);
  EXPECT_EQ(appended->block_table.size(), 2u);
  absl::StatusOr<PoolStats> stats = client.Stats();
  EXPECT_EQ(stats->blocks_reserved, 2u);
  absl::StatusOr<int64_t> length = client.Commit(5);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(*length, 70);
  ASSERT_TRUE(client.Append(5, Tokens(60, 100)).ok());
  length = client.Abort(5);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(*length, 70);
  EXPECT_TRUE(absl::IsFailedPrecondition(client.Commit(5).status()));  // nothing pending
  ASSERT_TRUE(client.Release(5).ok());
  ExpectNoBlockHeld(client);
}

// A raw DEALER, to send what the client library never would.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : dealer_(context_, endpoint, "") {}
  absl::Status SendBytes(std::vector<std::string> frames) {
    std::vector<zmq::message_t> messages;
    for (const std::string& f : frames) messages.emplace_back(f.data(), f.size());
    zmq::send_multipart(dealer_.socket(), messages);
    return absl::OkStatus();
  }
  // The status of the next reply: its error, or OK.
  absl::Status NextReply() {
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = dealer_.Receive(10'000);
    if (!reply.ok()) return absl::InternalError(reply.status().ToString());
    const auto body = (*reply)->envelope().getBody();
    return body.isError() ? StatusFromWire(body.getError()) : absl::OkStatus();
  }
  absl::Status Call(const EnvelopeBuilder& message) {
    return dealer_.Call(message, 10'000).status();
  }

 private:
  zmq::context_t context_{1};
  Dealer dealer_;
};

TEST(ServiceTest, BadInputGetsTypedErrorsAndTheDaemonKeepsServing) {
  auto service = StartOrDie(WithFlags({"--max_message_mib=1"}));
  ASSERT_NE(service, nullptr);
  RawPeer raw(service->endpoint());

  ASSERT_TRUE(raw.SendBytes({"not capnp"}).ok());
  absl::Status s = raw.NextReply();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  ASSERT_TRUE(raw.SendBytes({std::string(64, '\xff')}).ok());
  s = raw.NextReply();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  ASSERT_TRUE(raw.SendBytes({std::string(2 << 20, '\0')}).ok());  // 2 MiB > 1 MiB
  s = raw.NextReply();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("exceeds the limit"));

  EnvelopeBuilder future(7);
  future.envelope().setSchemaVersion(99);
  future.envelope().getBody().initHealth();
  s = raw.Call(future);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("schema version 99"));

  Client client(service->client_options("bad-input"));
  s = client.Decode({DecodeStepRequest{42, 1, std::nullopt, nullptr, nullptr}}).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  s = client.Release(42).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  s = client.Prefill(1, {}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;

  // Activations of a head_dim the pool does not have.
  absl::StatusOr<PoolHealth> health = client.Health();
  ASSERT_TRUE(health.ok());
  PoolSpec wrong = health->spec;
  wrong.head_dim = 96;
  TokenActivations act;
  for (int l = 0; l < wrong.num_layers; ++l) {
    act.k.emplace_back(4 * wrong.num_kv_heads * 96);
    act.v.emplace_back(4 * wrong.num_kv_heads * 96);
    act.index_k.emplace_back(4 * 128);
  }
  s = client.Prefill(9, Tokens(4, 1), &act, &wrong).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("layer 0 k: expected bf16 [4, 8, 128]"));

  // Decode before prefill: the prefill is still running when the decode arrives.
  EnvelopeBuilder prefill = client.NewRequest();
  Client::BuildPrefill(prefill, 10, Tokens(4000, 5), nullptr, nullptr);
  ASSERT_TRUE(client.Send(prefill).ok());
  s = client.Decode({DecodeStepRequest{10, 1, std::nullopt, nullptr, nullptr}}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("decode before prefill"));
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> prefill_reply = client.Receive(30'000);
  ASSERT_TRUE(prefill_reply.ok());
  EXPECT_TRUE(PrefillResultOf(**prefill_reply).ok());

  // A worker that lacks the pool's V format, and one reporting a job it was not given.
  EnvelopeBuilder unable(11);
  auto reg = unable.envelope().getBody().initRegister();
  reg.setRole(wire::Role::DECODE);
  // A worker whose kernels lack the pool's V format, turbo3.
  OpCapabilities without_turbo3 = kHostCapabilities.Decode();
  without_turbo3.v_formats = FormatsOf({KvFormat::kTurbo2, KvFormat::kTurbo4});
  ServedToWire(without_turbo3, reg.initCapabilities().initHostArena());
  s = raw.Call(unable);
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("turbo3"));

  EnvelopeBuilder stranger(12);
  stranger.envelope().getBody().initJobDone().setJob(12345);
  s = raw.Call(stranger);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;  // not a registered worker
  EnvelopeBuilder able(13);
  auto reg2 = able.envelope().getBody().initRegister();
  reg2.setRole(wire::Role::PREFILL);
  ServedToWire(kHostCapabilities.cache_write, reg2.initCapabilities().initHostArena());
  ASSERT_TRUE(raw.Call(able).ok());
  EnvelopeBuilder liar(14);
  liar.envelope().getBody().initJobDone().setJob(12345);
  s = raw.Call(liar);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("was not given to this worker"));

  // Still serving.
  absl::StatusOr<PrefillResult> ok = client.Prefill(20, Tokens(10, 3));
  EXPECT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(client.Release(20).ok());
  ASSERT_TRUE(client.Release(10).ok());
  ExpectNoBlockHeld(client);
}

TEST(ServiceTest, KilledWorkerWithoutAStandInFailsTheJobWithAborted) {
  auto service = StartOrDie(WithFlags({"--arena_mib=256"}));
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("victim"));
  EnvelopeBuilder prefill = client.NewRequest();
  Client::BuildPrefill(prefill, 1, Tokens(30000, 1), nullptr, nullptr);  // seconds of CPU work
  ASSERT_TRUE(client.Send(prefill).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  service->Stop(service->prefill_workers().at(0), SIGKILL);
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(10'000);
  ASSERT_TRUE(reply.ok()) << reply.status();  // an answer, not a hang
  absl::StatusOr<PrefillResult> result = PrefillResultOf(**reply);
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  ExpectNoBlockHeld(client);
}

TEST(ServiceTest, KilledWorkersJobIsRequeuedToAnother) {
  ServiceOptions options;
  options.daemon_flags = {"--arena_mib=256"};
  options.prefill_workers = 2;
  auto service = StartOrDie(options);
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("requeue"));
  for (uint64_t seq : {1, 2}) {  // one job per worker
    EnvelopeBuilder prefill = client.NewRequest();
    Client::BuildPrefill(prefill, seq, Tokens(20000, static_cast<int32_t>(seq) * 100000),
                         nullptr, nullptr);
    ASSERT_TRUE(client.Send(prefill).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  service->Stop(service->prefill_workers().at(0), SIGKILL);
  for (int i = 0; i < 2; ++i) {
    // The re-queued job waits for the other worker's own job: two prefills back to back, slow
    // under the sanitizers.
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(180'000);
    ASSERT_TRUE(reply.ok()) << reply.status();
    absl::StatusOr<PrefillResult> result = PrefillResultOf(**reply);
    EXPECT_TRUE(result.ok()) << result.status();
  }
  absl::StatusOr<DecodeResult> decoded =
      client.Decode({DecodeStepRequest{1, 5, std::nullopt, nullptr, nullptr}});
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(client.Release(1).ok());
  ASSERT_TRUE(client.Release(2).ok());
  ExpectNoBlockHeld(client);
}

TEST(ServiceTest, ADeadClientsSequencesAreReleased) {
  auto service = StartOrDie(WithFlags({"--client_lease_ms=500"}));
  ASSERT_NE(service, nullptr);
  {
    // It heartbeats while its prefill runs, which under the sanitizers on a loaded machine can
    // outlast the lease; once it is gone nothing renews the lease.
    ClientOptions options = service->client_options("short-lived");
    options.keep_alive_ms = 100;
    Client gone(options);
    absl::StatusOr<PrefillResult> prefill = gone.Prefill(1, Tokens(300, 1));
    ASSERT_TRUE(prefill.ok()) << prefill.status();
  }
  Client observer(service->client_options("observer"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  absl::StatusOr<PoolStats> stats = observer.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sequences, 0u);
  ExpectNoBlockHeld(observer);
}

TEST(ServiceTest, AClientWaitingForALongJobKeepsItsLease) {
  auto service = StartOrDie(WithFlags({"--client_lease_ms=400", "--arena_mib=256"}));
  ASSERT_NE(service, nullptr);
  ClientOptions options = service->client_options("patient");
  options.keep_alive_ms = 100;
  Client client(options);
  absl::StatusOr<PrefillResult> prefill = client.Prefill(1, Tokens(20000, 1));  // > 400 ms
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  absl::StatusOr<DecodeResult> decoded =
      client.Decode({DecodeStepRequest{1, 5, std::nullopt, nullptr, nullptr}});
  EXPECT_TRUE(decoded.ok()) << decoded.status();  // the sequence is still there
}

TEST(ServiceTest, MetricsAndHealthAreServedOverHttp) {
  const int port = FreePort();
  auto service =
      StartOrDie(WithFlags({absl::StrCat("--metrics_port=", port), "--arena_mib=256",
                            "--drain_timeout_ms=300000"}));
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("watched"));
  ASSERT_TRUE(client.Prefill(1, Tokens(100, 1)).ok());
  ASSERT_TRUE(client.Decode({DecodeStepRequest{1, 5, std::nullopt, nullptr, nullptr}}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a tick publishes the metrics
  httplib::Client http("127.0.0.1", port);
  httplib::Result health = http.Get("/healthz");
  ASSERT_TRUE(health) << "no answer on port " << port;
  EXPECT_EQ(health->status, 200);
  httplib::Result metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_blocks{pool=\"0\",gpu=\"host\",state=\"used\"} 2"));
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_workers{pool=\"0\",gpu=\"host\",role=\"decode\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_jobs_total{kind=\"decode\",outcome=\"ok\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_job_seconds_count{kind=\"prefill\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_prefix_query_tokens_total 100"));
  EXPECT_THAT(metrics->body, HasSubstr("kvpool_evicted_blocks_total{pool=\"0\",gpu=\"host\"} 0"));
  httplib::Result live = http.Get("/livez");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  httplib::Result ready = http.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;

  // Without a decode worker kvpoold is alive but not ready, and says what it lacks.
  ASSERT_EQ(service->Stop(service->decode_workers()[0], SIGKILL), 128 + SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ready = http.Get("/readyz");
    ASSERT_TRUE(ready);
  } while (ready->status == 200 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(ready->status, 503);
  EXPECT_THAT(ready->body, HasSubstr("pool 0 has 1 prefill and 0 decode workers"));
  live = http.Get("/livez");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);

  // While it drains, /healthz says so.
  EnvelopeBuilder prefill = client.NewRequest();
  Client::BuildPrefill(prefill, 2, Tokens(40000, 1000), nullptr, nullptr);  // seconds of work
  ASSERT_TRUE(client.Send(prefill).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(service->daemon(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  health = http.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(180'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(PrefillResultOf(**reply).ok());
}

TEST(ServiceTest, WorkersReRegisterWhenKvpooldComesBackAndSigtermDrains) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  {
    Client client(service->client_options("drain"));
    EnvelopeBuilder prefill = client.NewRequest();
    Client::BuildPrefill(prefill, 1, Tokens(5000, 1), nullptr, nullptr);
    ASSERT_TRUE(client.Send(prefill).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(service->daemon(), SIGTERM);
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(20'000);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_TRUE(PrefillResultOf(**reply).ok());  // the job in flight finished
  }
  EXPECT_EQ(service->Stop(service->daemon(), 0), 0);  // exited cleanly after the drain
  ASSERT_TRUE(service->RestartDaemon().ok());
  ASSERT_TRUE(service->WaitForWorkers(2, 20'000).ok());
  Client client(service->client_options("after-restart"));
  ASSERT_TRUE(client.Prefill(1, Tokens(100, 1)).ok());
  absl::StatusOr<DecodeResult> decoded =
      client.Decode({DecodeStepRequest{1, 5, std::nullopt, nullptr, nullptr}});
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  // Workers stop cleanly on SIGTERM too.
  EXPECT_EQ(service->Stop(service->decode_workers().at(0), SIGTERM), 0);
  EXPECT_EQ(service->Stop(service->prefill_workers().at(0), SIGTERM), 0);
}

}  // namespace
}  // namespace kvp::testing
