// On a GPU: every pool the cuda backend's table says a prefill or decode worker serves takes a
// prefill and a decode step through the cuda executor (kernels/capabilities.h).
#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"
#include "kernels/capabilities.h"
#include "kvpool/layout/block_layout.h"
#include "tests/worker/served_pools.h"
#include "worker/cuda_executor.h"

namespace kvp::testing {
namespace {

TEST(CudaCapabilitiesTest, EveryPoolTheCudaBackendAdvertisesDecodes) {
  const std::vector<JobContext> pools = PoolsServedBy(kCudaCapabilities.Decode());
  EXPECT_EQ(pools.size(), 1u * 3 * 3 * 2);  // K fp8, V turbo2-4, 3 head dims, indexer or not
  for (const JobContext& ctx : pools) {
    const BlockLayout layout = BlockLayout::Create(ctx.spec).value();
    void* arena = nullptr;
    ASSERT_EQ(cudaMalloc(&arena, static_cast<size_t>(kServedPoolBlocks) * layout.block_stride()),
              cudaSuccess);
    {
      absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
          CudaExecutor::Create(layout, static_cast<uint8_t*>(arena), ctx, 0);
      ASSERT_TRUE(executor.ok()) << executor.status();
      const absl::Status s = PrefillAndDecode(**executor, ctx);
      EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
    }
    cudaFree(arena);
  }
}

TEST(CudaCapabilitiesTest, APrefillWorkerWritesEveryFormatItAdvertises) {
  for (const JobContext& ctx : PoolsServedBy(kCudaCapabilities.cache_write)) {
    const BlockLayout layout = BlockLayout::Create(ctx.spec).value();
    void* arena = nullptr;
    ASSERT_EQ(cudaMalloc(&arena, static_cast<size_t>(kServedPoolBlocks) * layout.block_stride()),
              cudaSuccess);
    {
      absl::StatusOr<std::unique_ptr<CudaExecutor>> executor =
          CudaExecutor::Create(layout, static_cast<uint8_t*>(arena), ctx, 0);
      ASSERT_TRUE(executor.ok()) << executor.status();
      PrefillWork prefill;
      prefill.sequence = 1;
      for (int i = 0; i < 20; ++i) {
        prefill.tokens.push_back(i);
        prefill.slots.push_back(i);
      }
      const absl::Status s = (*executor)->Prefill(prefill);
      EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
    }
    cudaFree(arena);
  }
}

}  // namespace
}  // namespace kvp::testing
