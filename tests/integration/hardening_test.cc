// The defects an independent client found, each as real processes on the host backend: messages
// that used to take kvpoold down, one client reading another's cached K/V, clients waiting out
// their timeout on a dead kvpoold, NaN stored as data, one client starving the others.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvpool/format/calibration.h"
#include "protocol/dealer.h"
#include "protocol/status_codec.h"
#include "tests/integration/malformed_messages.h"
#include "tests/integration/service_processes.h"
#include "tests/testing/test_data.h"

namespace kvp::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ServiceProcesses> StartOrDie(std::vector<std::string> flags = {}) {
  ServiceOptions options;
  options.daemon_flags = std::move(flags);
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> s = ServiceProcesses::Start(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

absl::StatusOr<std::vector<float>> DecodeLastLayer(Client& client, uint64_t seq) {
  absl::StatusOr<DecodeResult> r = client.Decode({DecodeStepRequest{seq, 7, std::nullopt}});
  if (!r.ok()) return r.status();
  return r->steps.at(0).out.back();
}

TEST(HardeningTest, MalformedMessagesGetTypedErrorsAndTheDaemonServesOn) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  zmq::context_t context(1);
  Dealer raw(context, service->endpoint(), "");
  for (const MalformedMessage& m : MalformedMessages()) {
    const absl::Status s = ExpectRefused(raw, m);
    EXPECT_TRUE(s.ok()) << s;
  }
  Client client(service->client_options("after"));
  ASSERT_TRUE(client.Prefill(1, Tokens(10, 1)).ok());
  EXPECT_TRUE(client.Decode({DecodeStepRequest{1, 3, std::nullopt}}).ok());
}

TEST(HardeningTest, AbortingAnEngineAppendOfANewSequenceKeepsTheDaemonUp) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("engine"));
  ASSERT_TRUE(client.Append(5, Tokens(70, 1)).ok());
  absl::StatusOr<int64_t> length = client.Abort(5);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(*length, 0);
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks_reserved, 0u);
  EXPECT_EQ(stats->sequences, 0u);
}

TEST(HardeningTest, ClientTensorsAreSharedOnlyWhenTheirBytesAreTheSame) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client alice(service->client_options("alice")), bob(service->client_options("bob"));
  absl::StatusOr<PoolHealth> h = alice.Health();
  ASSERT_TRUE(h.ok());
  const std::vector<int32_t> prompt = Tokens(200, 1000);  // three full blocks of 64
  const TokenActivations mine = RandomActivations(h->spec, prompt.size(), 1);
  const TokenActivations theirs = RandomActivations(h->spec, prompt.size(), 2);
  ASSERT_TRUE(alice.Prefill(1, prompt, &mine, &h->spec).ok());
  // Bob's prompt has the same ids and his own tensors: nothing of Alice's is his.
  absl::StatusOr<PrefillResult> b = bob.Prefill(2, prompt, &theirs, &h->spec);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->prefix_hit_tokens, 0);
  // His decode reads his K/V: the same as over his tensors under other ids, where no sharing
  // could happen.
  ASSERT_TRUE(bob.Prefill(3, Tokens(200, 50'000), &theirs, &h->spec).ok());
  absl::StatusOr<std::vector<float>> over_shared_ids = DecodeLastLayer(bob, 2);
  absl::StatusOr<std::vector<float>> over_own_ids = DecodeLastLayer(bob, 3);
  absl::StatusOr<std::vector<float>> alices = DecodeLastLayer(alice, 1);
  ASSERT_TRUE(over_shared_ids.ok() && over_own_ids.ok() && alices.ok());
  EXPECT_EQ(*over_shared_ids, *over_own_ids);
  EXPECT_NE(*over_shared_ids, *alices);
  // The same bytes do share, and a client's Stats count only its own hits.
  Client carol(service->client_options("carol"));
  absl::StatusOr<PrefillResult> c = carol.Prefill(4, prompt, &mine, &h->spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefix_hit_tokens, 192);
  EXPECT_EQ(carol.Stats()->prefix_hit_blocks, 3u);
  EXPECT_EQ(bob.Stats()->prefix_hit_blocks, 0u);
}

TEST(HardeningTest, CacheNamespacesNeverShareNorRevealBlocks) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  ClientOptions red = service->client_options("red");
  red.cache_namespace = "tenant-red";
  ClientOptions red_too = service->client_options("red-too");
  red_too.cache_namespace = "tenant-red";
  ClientOptions blue = service->client_options("blue");
  blue.cache_namespace = "tenant-blue";
  Client r(red), r2(red_too), b(blue), plain(service->client_options("plain"));
  const std::vector<int32_t> prompt = Tokens(128, 7);
  ASSERT_TRUE(r.Prefill(1, prompt).ok());
  EXPECT_EQ(b.Prefill(2, prompt)->prefix_hit_tokens, 0);
  EXPECT_EQ(plain.Prefill(3, prompt)->prefix_hit_tokens, 0);
  EXPECT_EQ(r2.Prefill(4, prompt)->prefix_hit_tokens, 128);
  EXPECT_EQ(b.Stats()->prefix_hit_blocks, 0u);
  // Engine appends: shared inside a named namespace, never without one.
  Client engine(service->client_options("engine")), engine2(service->client_options("engine2"));
  ASSERT_TRUE(engine.Append(10, Tokens(64, 3)).ok());
  ASSERT_TRUE(engine.Commit(10).ok());
  EXPECT_EQ(engine2.Append(11, Tokens(64, 3))->prefix_hit_tokens, 0);
  ASSERT_TRUE(r.Append(12, Tokens(64, 90)).ok());
  ASSERT_TRUE(r.Commit(12).ok());
  EXPECT_EQ(r2.Append(13, Tokens(64, 90))->prefix_hit_tokens, 64);
  EXPECT_EQ(b.Append(14, Tokens(64, 90))->prefix_hit_tokens, 0);
}

TEST(HardeningTest, NonFiniteTensorsAreRefusedNamingTheValue) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("nan"));
  absl::StatusOr<PoolHealth> h = client.Health();
  ASSERT_TRUE(h.ok());
  TokenActivations a = RandomActivations(h->spec, 10, 3);
  const size_t row = size_t(h->spec.num_kv_heads) * h->spec.head_dim;
  a.v[1][3 * row + 2 * h->spec.head_dim + 17] =
      Bf16FromFloat(std::numeric_limits<float>::quiet_NaN());
  absl::Status s = client.Prefill(1, Tokens(10, 1), &a, &h->spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("v of layer 1 at [3, 2, 17] is NaN"));
  a.v[1][3 * row + 2 * h->spec.head_dim + 17] = Bf16FromFloat(1.0f);
  a.k[0][5] = Bf16FromFloat(-std::numeric_limits<float>::infinity());
  s = client.Prefill(1, Tokens(10, 1), &a, &h->spec).status();
  EXPECT_THAT(s.message(), HasSubstr("k of layer 0 at [0, 0, 5] is Inf"));
  absl::StatusOr<PoolStats> stats = client.Stats();
  EXPECT_EQ(stats->rejected_nonfinite, 2u);
  EXPECT_EQ(stats->sequences, 0u);
  EXPECT_EQ(stats->blocks_reserved, 0u);
}

TEST(HardeningTest, OneClientCannotTakeThePoolOrTheQueue) {
  auto service = StartOrDie({"--client_max_blocks=4", "--client_max_requests=1"});
  ASSERT_NE(service, nullptr);
  Client greedy(service->client_options("greedy")), other(service->client_options("other"));
  EXPECT_EQ(greedy.Health()->client_max_blocks, 4u);
  ASSERT_TRUE(greedy.Prefill(1, Tokens(256, 1)).ok());  // four blocks: at the limit
  absl::Status s = greedy.Prefill(2, Tokens(10, 1)).status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--client_max_blocks"));
  EXPECT_EQ(greedy.Stats()->client_blocks, 4u);
  EXPECT_TRUE(other.Prefill(3, Tokens(200, 5000)).ok()) << "the others are not starved";
  // A second request while the first is in flight: refused, the first still answered.
  EnvelopeBuilder first = greedy.NewRequest(), second = greedy.NewRequest();
  ASSERT_TRUE(greedy.Release(1).ok());
  Client::BuildPrefill(first, 4, Tokens(200, 9000), nullptr, nullptr);
  Client::BuildPrefill(second, 5, Tokens(10, 1), nullptr, nullptr);
  ASSERT_TRUE(greedy.Send(first).ok());
  ASSERT_TRUE(greedy.Send(second).ok());
  int refused = 0, answered = 0;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = greedy.Receive(30'000);
    ASSERT_TRUE(reply.ok()) << reply.status();
    const auto body = (*reply)->envelope().getBody();
    if (body.isError()) {
      EXPECT_TRUE(absl::IsResourceExhausted(StatusFromWire(body.getError())));
      EXPECT_EQ((*reply)->request_id(), second.request_id());
      ++refused;
    } else {
      EXPECT_TRUE(body.isPrefillReply());
      ++answered;
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(answered, 1);
}

std::vector<float> ToFloat(const std::vector<Bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = Bf16ToFloat(v[i]);
  return f;
}

// One decode step after a prompt of client K (σ 1) and small V (σ 1e-3) on a kvpoold started
// with `flags`: the outputs' relative L2 error against float attention over the same bf16 K/V
// (every position is selected: the prompt is shorter than top-k). `v_scales` gets what
// kvpoolctl calibrate would pick from the prompt's V.
double SmallVDecodeError(std::vector<std::string> flags, bool calibrate) {
  constexpr int kPrompt = 40;
  auto probe = StartOrDie(flags);  // for the pool's shape
  if (probe == nullptr) return -1;
  Client client(probe->client_options("small-v"));
  const PoolSpec spec = client.Health()->spec;
  const ModelConfig model = client.Health()->model;
  std::mt19937_64 rng(11);
  const size_t row = size_t(spec.num_kv_heads) * spec.head_dim;
  TokenActivations prompt, step;
  for (int l = 0; l < spec.num_layers; ++l) {
    prompt.k.push_back(RandomBf16(rng, kPrompt * row));
    prompt.v.push_back(RandomBf16(rng, kPrompt * row, 1e-3f));
    prompt.index_k.push_back(RandomBf16(rng, kPrompt * 128));
    step.k.push_back(RandomBf16(rng, row));
    step.v.push_back(RandomBf16(rng, row, 1e-3f));
    step.index_k.push_back(RandomBf16(rng, 128));
  }
  if (calibrate) {
    std::vector<std::string> scales;
    for (int l = 0; l < spec.num_layers; ++l) {
      scales.push_back(absl::StrCat(
          CalibrateScale(ToFloat(prompt.v[l]), spec.head_dim, spec.v_format, spec.v_rotation)
              .scale));
    }
    flags.push_back(absl::StrCat("--v_scales=", absl::StrJoin(scales, ",")));
  }
  probe.reset();
  auto service = StartOrDie(flags);
  if (service == nullptr) return -1;
  Client c(service->client_options("small-v"));
  const std::vector<int32_t> ids = Tokens(kPrompt, 1);
  EXPECT_TRUE(c.Prefill(1, ids, &prompt, &spec).ok());
  StepQueries q;
  for (int l = 0; l < spec.num_layers; ++l) {
    q.q.push_back(RandomBf16(rng, size_t(model.num_q_heads) * spec.head_dim));
    q.index_q.push_back(RandomBf16(rng, 64 * 128));
    q.head_weights.emplace_back(64, 1.0f / 64);
  }
  absl::StatusOr<DecodeResult> r = c.Decode({DecodeStepRequest{1, 99, std::nullopt, &step, &q}},
                                            wire::OutputLayers::ALL, &spec, &model);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return -1;
  // Float attention over the bf16 K/V of positions 0..kPrompt (the step's own token included).
  const int d = spec.head_dim, group = model.num_q_heads / spec.num_kv_heads;
  double err = 0, norm = 0;
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int h = 0; h < model.num_q_heads; ++h) {
      const int g = h / group;
      // Element i of kv head g at row p of one of the tensors.
      const auto kv = [&](const std::vector<std::vector<Bf16>>& t, int p, int i) {
        return Bf16ToFloat(t[l][(size_t(p) * spec.num_kv_heads + g) * d + i]);
      };
      std::vector<double> logits(kPrompt + 1), out(d, 0.0);
      double top = -1e300, sum = 0;
      for (int p = 0; p <= kPrompt; ++p) {
        double dot = 0;
        for (int i = 0; i < d; ++i) {
          const float k = p < kPrompt ? kv(prompt.k, p, i) : kv(step.k, 0, i);
          dot += double(Bf16ToFloat(q.q[l][size_t(h) * d + i])) * k;
        }
        logits[p] = dot / std::sqrt(double(d));
        top = std::max(top, logits[p]);
      }
      for (int p = 0; p <= kPrompt; ++p) {
        const double w = std::exp(logits[p] - top);
        sum += w;
        for (int i = 0; i < d; ++i) {
          out[i] += w * (p < kPrompt ? kv(prompt.v, p, i) : kv(step.v, 0, i));
        }
      }
      for (int i = 0; i < d; ++i) {
        const double ref = out[i] / sum, got = r->steps[0].out[l][size_t(h) * d + i];
        err += (got - ref) * (got - ref);
        norm += ref * ref;
      }
    }
  }
  return std::sqrt(err / norm);
}

TEST(HardeningTest, SmallVKeepsItsAccuracyWithACalibratedVScale) {
  const double plain = SmallVDecodeError({}, false);
  const double calibrated = SmallVDecodeError({}, true);
  std::printf("small-V decode error: %.4f at v_scale 1, %.4f calibrated\n", plain, calibrated);
  EXPECT_GT(plain, 0.5);
  EXPECT_LT(calibrated, 0.25);
}

TEST(HardeningTest, BadSettingsStopKvpooldWithAClearError) {
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{{"--k_scales=0"},
                                             {"--v_scales=nan"},
                                             {"--k_scales=1,2,3"},  // the test pool has 2 layers
                                             {"--sliding_windows=16"},  // with an indexer
                                             {"--sparse_v_threshold=-1"},
                                             {"--client_max_requests=0"},
                                             {"--softmax_scale=-1"},
                                             {"--pool_kind=gqa"},
                                             // MLA: K/V flags refused, heads 16 to 128 by 16
                                             {"--pool_kind=mla", "--kv_heads=4"},
                                             {"--pool_kind=mla", "--indexer=false"},
                                             {"--pool_kind=mla", "--q_heads=24"}}) {
    absl::StatusOr<int> exit = ServiceProcesses::RunDaemonToExit(flags, 20'000);
    ASSERT_TRUE(exit.ok()) << flags[0] << ": " << exit.status();
    EXPECT_NE(*exit, 0) << flags[0];
  }
}

// Per layer, the outputs of one decode step of two 100-token prompts that differ only in the
// token at position 3, on a dense-decode kvpoold started with `flags`.
std::vector<std::vector<float>> TwoPromptsOutputs(std::vector<std::string> flags,
                                                  std::vector<std::vector<float>>* other) {
  flags.push_back("--indexer=false");
  auto service = StartOrDie(flags);
  if (service == nullptr) return {};
  Client client(service->client_options("settings"));
  std::vector<int32_t> b = Tokens(100, 1);
  b[3] = 5000;
  EXPECT_TRUE(client.Prefill(1, Tokens(100, 1)).ok());
  EXPECT_TRUE(client.Prefill(2, b).ok());
  absl::StatusOr<DecodeResult> r =
      client.Decode({DecodeStepRequest{1, 7, std::nullopt}, DecodeStepRequest{2, 7, std::nullopt}});
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  *other = r->steps[1].out;
  return r->steps[0].out;
}

TEST(HardeningTest, SettingsReachTheKernelsAndAreReported) {
  const std::vector<std::string> flags = {"--sliding_windows=8,0", "--k_scales=0.5",
                                          "--sparse_v_threshold=0.001"};
  {
    auto service = StartOrDie({"--indexer=false", flags[0], flags[1], flags[2]});
    ASSERT_NE(service, nullptr);
    Client client(service->client_options("settings"));
    absl::StatusOr<PoolHealth> h = client.Health();
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->spec.k_scales, (std::vector<float>{0.5f, 0.5f}));
    EXPECT_EQ(h->model.sliding_windows, (std::vector<int>{8, 0}));
    EXPECT_FLOAT_EQ(h->model.sparse_v_threshold, 0.001f);
  }
  // Layer 0 attends to the last 8 positions only: position 3 cannot change its output; layer 1
  // attends to all.
  std::vector<std::vector<float>> b, b_exact;
  const std::vector<std::vector<float>> a = TwoPromptsOutputs(flags, &b);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  // τ reaches the kernels: without it, the same step gives other outputs.
  const std::vector<std::vector<float>> exact =
      TwoPromptsOutputs({"--sliding_windows=8,0", "--k_scales=0.5"}, &b_exact);
  ASSERT_EQ(exact.size(), 2u);
  EXPECT_NE(exact[1], a[1]);
}

TEST(HardeningTest, NobodyWaitsOnADeadDaemonAndALostSequenceSaysSo) {
  auto service = StartOrDie();
  ASSERT_NE(service, nullptr);
  Client client(service->client_options("waiter"));
  ASSERT_TRUE(client.Prefill(1, Tokens(100, 1)).ok());
  // A prefill that cannot finish (its worker is stopped) is in flight when kvpoold dies.
  ASSERT_EQ(::kill(service->prefill_workers().at(0), SIGSTOP), 0);
  EnvelopeBuilder stuck = client.NewRequest();
  Client::BuildPrefill(stuck, 2, Tokens(100, 500), nullptr, nullptr);
  ASSERT_TRUE(client.Send(stuck).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  service->Stop(service->daemon(), SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(60'000);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("lost the connection to kvpoold"));
  EXPECT_LT(waited, std::chrono::seconds(30)) << "failed at once, not after the timeout";
  ASSERT_EQ(::kill(service->prefill_workers().at(0), SIGCONT), 0);
  // The restarted kvpoold does not have sequence 1, and says why.
  ASSERT_TRUE(service->RestartDaemon().ok());
  absl::Status s = absl::UnavailableError("");
  for (int i = 0; i < 50 && absl::IsUnavailable(s); ++i) s = client.Release(1).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("has restarted"));
}

}  // namespace
}  // namespace kvp::testing
