// The service on the cuda backend (label gpu): kvpoold's arena in GPU memory, workers running the
// CUDA kernels. Its outputs agree with the host backend's in-process run of the same workload.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/in_process_reference.h"
#include "tests/integration/service_processes.h"

namespace kvp::testing {
namespace {

double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    ref += double(want[i]) * want[i];
  }
  return std::sqrt(err / ref);
}

// Run on both pool kinds: the default KV pool, and an MLA pool of 128 query heads (DeepSeek-V3.2's).
class ServiceGpuFlowTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(PoolKinds, ServiceGpuFlowTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& kind) {
                           return kind.param ? "Mla" : "Kv";
                         });

TEST_P(ServiceGpuFlowTest, CudaBackendAgreesWithTheHostReference) {
  ServiceOptions options;
  options.backend = "cuda";
  options.daemon_flags = {"--arena_mib=1024", "--gpu=0"};
  if (GetParam()) {
    options.daemon_flags.insert(options.daemon_flags.end(), {"--pool_kind=mla", "--q_heads=128"});
  }
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> service = ServiceProcesses::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  Client client((*service)->client_options("gpu-flow"));
  WorkloadConfig config;
  config.sequences = 4;
  config.prompt_tokens = 1000;
  config.decode_steps = 6;
  config.shared_prefix_tokens = 256;
  config.verify_sequences = 2;
  std::vector<DecodeResult> served;
  absl::StatusOr<WorkloadReport> report =
      RunWorkload(client, config, [](const std::string&, int64_t, int64_t) {}, &served);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->needles_found, report->needles);

  absl::StatusOr<PoolHealth> health = client.Health();
  ASSERT_TRUE(health.ok());
  absl::StatusOr<std::vector<std::vector<DecodeStepResult>>> reference =
      RunWorkloadInProcess(config, health->spec, health->model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(served.size(), reference->size());
  int64_t selected = 0, agreed = 0, compared = 0;
  for (size_t step = 0; step < served.size(); ++step) {
    for (size_t i = 0; i < served[step].steps.size(); ++i) {
      const DecodeStepResult& got = served[step].steps[i];
      const DecodeStepResult& want = (*reference)[step][i];
      ASSERT_EQ(got.out.size(), want.out.size());
      for (size_t l = 0; l < got.out.size(); ++l) {
        for (int32_t p : want.topk[l]) {
          selected += p >= 0;
          agreed += p >= 0 && std::count(got.topk[l].begin(), got.topk[l].end(), p);
        }
        if (got.topk[l] != want.topk[l]) continue;  // a near-tie chose another position
        EXPECT_LT(RelativeL2(got.out[l], want.out[l]), 5e-3)
            << "step " << step << " sequence " << i << " layer " << l;
        ASSERT_EQ(got.lse.size(), want.lse.size());
        if (!want.lse.empty()) {  // scores from K rounded to bf16: up to 2^-9 of their size
          EXPECT_LT(RelativeL2(got.lse[l], want.lse[l]), 2e-3) << "step " << step;
        }
        ++compared;
      }
    }
  }
  EXPECT_GE(double(agreed) / selected, 0.98);
  EXPECT_GE(compared, int64_t(served.size() * config.sequences * 2 * 3 / 4));
}

}  // namespace
}  // namespace kvp::testing

namespace kvp::testing {
namespace {

// Two pools on one GPU (kvpoold --gpus=0,0): a sequence prefilled on pool 0 and moved to pool 1 by
// the peer-copy path decodes to the same bits as one that stayed on pool 0, and both tables hold
// the same bytes (the outputs of every layer and the indexer's selection agree exactly).
TEST(ServiceGpuTest, TwoPoolsOnOneGpuMoveSequencesByPeerCopyBitForBit) {
  ServiceOptions options;
  options.backend = "cuda";
  options.daemon_flags = {"--arena_mib=1024", "--gpus=0,0"};
  options.prefill_workers = 1;
  options.prefill_pools = {0};
  options.decode_workers = 2;
  options.decode_pools = {0, 1};
  options.worker_flags = {"--gpu=0"};
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> service = ServiceProcesses::Start(options);
  ASSERT_TRUE(service.ok()) << service.status();
  ClientOptions stay_options = (*service)->client_options("stay");
  stay_options.cache_namespace = "stay";
  ClientOptions move_options = (*service)->client_options("move");
  move_options.cache_namespace = "move";
  Client stay(stay_options), move(move_options);
  std::vector<int32_t> prompt(5000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 31 % 50000);
  ASSERT_TRUE(stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  // Written in slices of 1024 tokens whose blocks stream to pool 1 while the next is written.
  absl::StatusOr<PrefillResult> moved = move.Prefill(
      2, prompt, nullptr, nullptr, {.pool = 0, .decode_pool = 1, .chunk_tokens = 1024});
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_TRUE(moved->migration.has_value());
  EXPECT_TRUE(moved->migration->error.ok()) << moved->migration->error;
  EXPECT_EQ(moved->migration->transport, wire::Transport::PEER_COPY);
  EXPECT_EQ(moved->migration->blocks_moved, 79u) << "5000 tokens in blocks of 64";
  EXPECT_EQ(moved->pool, 1u);
  for (int step = 0; step < 4; ++step) {
    const DecodeStepRequest a{1, 100 + step, std::nullopt, nullptr, nullptr};
    const DecodeStepRequest b{2, 100 + step, std::nullopt, nullptr, nullptr};
    absl::StatusOr<DecodeResult> here = stay.Decode({a});
    absl::StatusOr<DecodeResult> there = move.Decode({b});
    ASSERT_TRUE(here.ok() && there.ok()) << here.status() << there.status();
    EXPECT_EQ(here->steps.at(0).out, there->steps.at(0).out) << "step " << step;
    EXPECT_EQ(here->steps.at(0).topk, there->steps.at(0).topk) << "step " << step;
  }
  // A fragmented move back (the decode steps added blocks elsewhere) and one more step.
  absl::StatusOr<MigrationResult> back = move.Migrate(2, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  absl::StatusOr<DecodeResult> here = stay.Decode({{1, 7, std::nullopt, nullptr, nullptr}});
  absl::StatusOr<DecodeResult> there = move.Decode({{2, 7, std::nullopt, nullptr, nullptr}});
  ASSERT_TRUE(here.ok() && there.ok());
  EXPECT_EQ(here->steps.at(0).out, there->steps.at(0).out);
  ASSERT_TRUE(stay.Release(1).ok());
  ASSERT_TRUE(move.Release(2).ok());
  absl::StatusOr<PoolStats> stats = move.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->blocks_used, 0u);
  EXPECT_EQ(stats->blocks_reserved, 0u);
}

}  // namespace
}  // namespace kvp::testing

namespace kvp::testing {
namespace {

// Two GPUs (label multigpu; skipped with fewer): kvpoold --gpus=0,1, prefill on GPU 0, decode on
// GPU 1, by the transport kvpoold picks (peer copy where GPU 1 can read GPU 0, else NCCL) and by
// NCCL forced. The outputs equal a sequence that stayed on GPU 0's pool bit for bit, for a
// contiguous and a fragmented block table. A receiver killed holding a move, and the source's
// workers (the sender among them) stopped and killed during one, leave nothing on either pool and
// the sequence readable on GPU 0.
class ServiceMultiGpuTest : public ::testing::TestWithParam<const char*> {};

void ExpectSameSteps(Client& a, uint64_t seq_a, Client& b, uint64_t seq_b, int first_token) {
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<DecodeResult> here =
        a.Decode({{seq_a, first_token + step, std::nullopt, nullptr, nullptr}});
    absl::StatusOr<DecodeResult> there =
        b.Decode({{seq_b, first_token + step, std::nullopt, nullptr, nullptr}});
    ASSERT_TRUE(here.ok() && there.ok()) << here.status() << there.status();
    EXPECT_EQ(here->steps.at(0).out, there->steps.at(0).out) << "step " << step;
    EXPECT_EQ(here->steps.at(0).topk, there->steps.at(0).topk) << "step " << step;
  }
}

void SendMigrate(Client& client, uint64_t seq, uint32_t to) {
  EnvelopeBuilder m = client.NewRequest();
  m.envelope().getBody().initMigrate().setSequence(seq);
  m.envelope().getBody().getMigrate().setToPool(to);
  ASSERT_TRUE(client.Send(m).ok());
}

void ExpectAbortedAndNothingOnPool1(Client& client) {
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = client.Receive(30'000);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(absl::IsAborted(MigrationResultOf(**reply).status()))
      << MigrationResultOf(**reply).status();
  absl::StatusOr<PoolStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pools.at(1).blocks_reserved, 0u);
  EXPECT_EQ(stats->pools.at(1).blocks_used, 0u);
}

TEST_P(ServiceMultiGpuTest, APrefillOnGpu0DecodedOnGpu1) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string transport = GetParam();
  int peer = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&peer, 1, 0), cudaSuccess);
  ServiceOptions options;
  options.backend = "cuda";
  options.daemon_flags = {"--arena_mib=2048", "--gpus=0,1", "--transfer_timeout_ms=4000",
                          absl::StrCat("--transport=", transport)};
  options.prefill_workers = 0;
  options.decode_workers = 0;
  absl::StatusOr<std::unique_ptr<ServiceProcesses>> started = ServiceProcesses::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  ServiceProcesses& service = **started;
  const auto worker = [&](const char* role, int gpu) {
    return service.StartWorker(role, -1, {absl::StrCat("--gpu=", gpu)});
  };
  const pid_t prefill0 = worker("prefill", 0);
  const pid_t decode0 = worker("decode", 0);
  const pid_t receiver = worker("decode", 1);
  ASSERT_TRUE(service.WaitForWorkers(3, 30'000).ok());
  ClientOptions stay_options = service.client_options("stay");
  stay_options.cache_namespace = "stay";
  ClientOptions move_options = service.client_options("move");
  move_options.cache_namespace = "move";
  Client stay(stay_options), move(move_options);
  std::vector<int32_t> prompt(8000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 17 % 40000);
  ASSERT_TRUE(stay.Prefill(1, prompt, nullptr, nullptr, {.pool = 0}).ok());
  // Streamed: slices of 2048 tokens, each slice's blocks moved while the next is written.
  absl::StatusOr<PrefillResult> moved = move.Prefill(
      2, prompt, nullptr, nullptr, {.pool = 0, .decode_pool = 1, .chunk_tokens = 2048});
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_TRUE(moved->migration.has_value());
  ASSERT_TRUE(moved->migration->error.ok()) << moved->migration->error;
  EXPECT_EQ(moved->migration->blocks_moved, 125u) << "8000 tokens in blocks of 64";
  const wire::Transport expected = transport == "nccl" || !peer ? wire::Transport::NCCL
                                                                : wire::Transport::PEER_COPY;
  EXPECT_EQ(moved->migration->transport, expected);
  EXPECT_EQ(moved->pool, 1u);
  ExpectSameSteps(stay, 1, move, 2, 50);

  // A fragmented table (two sequences' chunked prefills interleaved), moved and decoded there.
  for (int chunk = 0; chunk < 12; ++chunk) {
    const std::vector<int32_t> tokens(prompt.begin() + chunk * 64, prompt.begin() + chunk * 64 + 64);
    ASSERT_TRUE(stay.Prefill(3, tokens, nullptr, nullptr, {.pool = 0}).ok());
    ASSERT_TRUE(move.Prefill(4, tokens, nullptr, nullptr, {.pool = 0}).ok());
  }
  absl::StatusOr<MigrationResult> fragmented = move.Migrate(4, 1);
  ASSERT_TRUE(fragmented.ok()) << fragmented.status();
  EXPECT_EQ(fragmented->transport, expected);
  ExpectSameSteps(stay, 3, move, 4, 70);

  // Back to GPU 0, then to GPU 1 again with its receiver killed while it holds the move.
  ASSERT_TRUE(move.Migrate(2, 0).ok());
  ASSERT_EQ(::kill(receiver, SIGSTOP), 0);
  SendMigrate(move, 2, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  service.Stop(receiver, SIGKILL);
  ExpectAbortedAndNothingOnPool1(move);
  ASSERT_TRUE(move.Decode({{2, 60, std::nullopt, nullptr, nullptr}}).ok()) << "still on GPU 0";

  // A new receiver; the source's workers stopped before the move (one of them is its sender)
  // and killed after it failed: aborted at the link's deadline, nothing left on GPU 1.
  worker("decode", 1);
  ASSERT_TRUE(service.WaitForWorkers(3, 30'000).ok());
  if (expected == wire::Transport::NCCL) {
    ASSERT_EQ(::kill(prefill0, SIGSTOP), 0);
    ASSERT_EQ(::kill(decode0, SIGSTOP), 0);
    SendMigrate(move, 2, 1);
    ExpectAbortedAndNothingOnPool1(move);
    service.Stop(prefill0, SIGKILL);
    service.Stop(decode0, SIGKILL);
    worker("decode", 0);
    ASSERT_TRUE(service.WaitForWorkers(2, 30'000).ok());
    ASSERT_TRUE(move.Decode({{2, 61, std::nullopt, nullptr, nullptr}}).ok()) << "still on GPU 0";
    absl::StatusOr<MigrationResult> landed = move.Migrate(2, 1);
    ASSERT_TRUE(landed.ok()) << landed.status();
  }
  for (uint64_t seq : {1, 3}) ASSERT_TRUE(stay.Release(seq).ok());
  for (uint64_t seq : {2, 4}) ASSERT_TRUE(move.Release(seq).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, ServiceMultiGpuTest, ::testing::Values("auto", "nccl"));

}  // namespace
}  // namespace kvp::testing
