// On a GPU: every pool the cuda backend's table says a prefill or decode worker serves takes a
// prefill and a decode step through the cuda executor (kernels/capabilities.h).
#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/capabilities.h"
#include "kvpool/layout/block_layout.h"
#include "tests/worker/served_pools.h"
#include "worker/cuda_executor.h"

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
  EXPECT_EQ(pools.size(), 1u * 3 * 3 * 2);  // K fp8, V turbo2-4, 3 head dims, indexer or not
  for (const JobContext& ctx : pools) {
    const absl::Status s =
        OnCudaExecutor(ctx, [&](CudaExecutor& e) { return PrefillAndDecode(e, ctx); });
    EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
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
