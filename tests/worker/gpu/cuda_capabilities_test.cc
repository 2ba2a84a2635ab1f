// On a GPU: every pool the cuda backend's table says a prefill or decode worker serves takes a
// prefill and a decode step through the cuda executor (kernels/capabilities.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/capabilities.h"
#include "kvpool/layout/block_layout.h"
#include "tests/worker/served_pools.h"
#include "worker/cuda_executor.h"
#include "worker/host_executor.h"

namespace kvp::testing {
namespace {

// Runs `job` on a cuda executor over a fresh device arena of `ctx`'s pool; its status.
absl::Status OnCudaExecutor(const JobContext& ctx,
                            const std::function<absl::Status(CudaExecutor&)>& job) {
  const BlockLayout layout = BlockLayout::Create(ctx.spec).value();
  void* arena = nullptr;
  if (cudaMalloc(&arena, static_cast<size_t>(kServedPoolBlocks) * layout.block_stride()) !=
      cudaSuccess) {
    return absl::InternalError("cudaMalloc failed");
  }
  absl::Status s;
  {
    absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
        CudaExecutor::Create(layout, static_cast<uint8_t*>(arena), ctx, 0);
    s = executor.ok() ? job(**executor) : executor.status();
  }
  cudaFree(arena);
  return s;
}

TEST(CudaCapabilitiesTest, EveryPoolTheCudaBackendAdvertisesDecodes) {
  const std::vector<JobContext> pools = PoolsServedBy(kCudaCapabilities.Decode());
  // K fp8, V turbo2-4, 3 head dims, indexer or not; and an MLA pool.
  EXPECT_EQ(pools.size(), 1u * 3 * 3 * 2 + 1);
  for (const JobContext& ctx : pools) {
    const absl::Status s =
        OnCudaExecutor(ctx, [&](CudaExecutor& e) { return PrefillAndDecode(e, ctx); });
    EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
  }
}

// An MLA pool through both executors: the same jobs leave the same bytes (latents and index keys
// are written bit for bit), select the same positions and agree on the outputs within bf16.
TEST(CudaCapabilitiesTest, AnMlaPoolMatchesTheHostExecutor) {
  JobContext ctx;
  ctx.spec = MlaPoolSpec(/*num_layers=*/3, /*block_size=*/16, /*indexer_ue8m0=*/true);
  ctx.num_blocks = kServedPoolBlocks;
  ctx.model.num_q_heads = 128;
  ctx.model.topk = 32;
  const BlockLayout layout = BlockLayout::Create(ctx.spec).value();
  const size_t bytes = static_cast<size_t>(kServedPoolBlocks) * layout.block_stride();
  PrefillWork prefill;
  prefill.sequence = 1;
  for (int i = 0; i < 60; ++i) {
    prefill.tokens.push_back(300 + 7 * i);
    prefill.slots.push_back(i < 32 ? 32 + i : i - 32);  // blocks 2, 3, then 0, 1
  }
  DecodeWork decode;
  DecodeStepWork step;
  step.sequence = 1;
  step.token = 9;
  step.position = 60;
  step.slot = 60 - 32;
  step.block_table = {2, 3, 0, 1};
  step.needle = SyntheticNeedle{17, prefill.tokens[17], 0.5f};
  decode.steps.push_back(step);

  std::vector<uint8_t> host_arena(bytes, 0);
  HostExecutor host(layout, host_arena.data(), ctx);
  ASSERT_TRUE(host.Prefill(prefill).ok());
  absl::StatusOr<std::vector<DecodeStepResult>> want = host.Decode(decode);
  ASSERT_TRUE(want.ok()) << want.status();

  std::vector<uint8_t> gpu_arena(bytes);
  absl::StatusOr<std::vector<DecodeStepResult>> got;
  void* arena = nullptr;
  ASSERT_EQ(cudaMalloc(&arena, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(arena, 0, bytes), cudaSuccess);
  {
    absl::StatusOr<std::unique_ptr<CudaExecutor>> cuda =
        CudaExecutor::Create(layout, static_cast<uint8_t*>(arena), ctx, 0);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    ASSERT_TRUE((*cuda)->Prefill(prefill).ok());
    got = (*cuda)->Decode(decode);
  }
  ASSERT_EQ(cudaMemcpy(gpu_arena.data(), arena, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(arena);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(gpu_arena == host_arena) << "the arenas' bytes differ";
  ASSERT_EQ((*got)[0].out.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ((*got)[0].topk[l], (*want)[0].topk[l]) << "layer " << l;
    EXPECT_NE(std::count((*got)[0].topk[l].begin(), (*got)[0].topk[l].end(), 17), 0);
    double err = 0, ref = 0;
    for (size_t i = 0; i < (*want)[0].out[l].size(); ++i) {
      const double d = double((*got)[0].out[l][i]) - (*want)[0].out[l][i];
      err += d * d;
      ref += double((*want)[0].out[l][i]) * (*want)[0].out[l][i];
    }
    EXPECT_LT(std::sqrt(err / ref), 5e-3) << "layer " << l;
    // The tensor cores take K rounded to bf16 (as FlashMLA does): a score, and so the log-sum-exp,
    // is off by up to 2^-9 of its size.
    for (int h = 0; h < 128; ++h) {
      EXPECT_NEAR((*got)[0].lse[l][h], (*want)[0].lse[l][h],
                  2e-3 * std::abs((*want)[0].lse[l][h]) + 1e-3);
    }
  }
}

TEST(CudaCapabilitiesTest, APrefillWorkerWritesEveryFormatItAdvertises) {
  PrefillWork prefill;
  prefill.sequence = 1;
  for (int i = 0; i < 20; ++i) {
    prefill.tokens.push_back(i);
    prefill.slots.push_back(i);
  }
  for (const JobContext& ctx : PoolsServedBy(kCudaCapabilities.cache_write)) {
    const absl::Status s = OnCudaExecutor(ctx, [&](CudaExecutor& e) { return e.Prefill(prefill); });
    EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
  }
}

}  // namespace
}  // namespace kvp::testing
