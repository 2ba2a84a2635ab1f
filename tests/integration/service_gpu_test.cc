// The service on the cuda backend (label gpu): kvpoold's arena in GPU memory, workers running the
// CUDA kernels. Its outputs agree with the host backend's in-process run of the same workload.
#include <cmath>

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

TEST(ServiceGpuTest, CudaBackendAgreesWithTheHostReference) {
  ServiceOptions options;
  options.backend = "cuda";
  options.daemon_flags = {"--arena_mib=1024", "--gpu=0"};
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
        ++compared;
      }
    }
  }
  EXPECT_GE(double(agreed) / selected, 0.98);
  EXPECT_GE(compared, int64_t(served.size() * config.sequences * 2 * 3 / 4));
}

}  // namespace
}  // namespace kvp::testing
