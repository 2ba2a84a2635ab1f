// What a worker registers for is what it runs (kernels/capabilities.h): every pool the host
// backend's table says a prefill or decode worker serves takes a prefill and a decode step
// through the host executor, and kvpoold refuses a worker for a pool its table lacks.
#include "kernels/capabilities.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvpool/layout/block_layout.h"
#include "protocol/capabilities_codec.h"
#include "protocol/framing.h"
#include "tests/worker/served_pools.h"
#include "worker/attachment.h"
#include "worker/host_executor.h"

namespace kvp::testing {
namespace {

TEST(CapabilitiesTest, EveryPoolTheHostBackendAdvertisesDecodes) {
  const std::vector<JobContext> pools = PoolsServedBy(kHostCapabilities.Decode());
  // K bf16/fp8, V bf16/turbo2-4, 3 head dims, indexer or not; and an MLA pool.
  EXPECT_EQ(pools.size(), 2u * 4 * 3 * 2 + 1);
  EXPECT_TRUE(pools.back().spec.mla());
  for (const JobContext& ctx : pools) {
    const BlockLayout layout = BlockLayout::Create(ctx.spec).value();
    std::vector<uint8_t> arena(static_cast<size_t>(kServedPoolBlocks) * layout.block_stride());
    HostExecutor executor(layout, arena.data(), ctx);
    const absl::Status s = PrefillAndDecode(executor, ctx);
    EXPECT_TRUE(s.ok()) << ctx.spec.DebugString() << ": " << s;
  }
}

TEST(CapabilitiesTest, RegistrationSaysWhatTheKernelsServeOnEachArena) {
  const WorkerServes host_only = ServedFor(Backend::kHost, wire::Role::DECODE);
  ASSERT_TRUE(host_only.host.has_value());
  EXPECT_FALSE(host_only.cuda.has_value());
  const WorkerServes decode = ServedFor(Backend::kAuto, wire::Role::DECODE);
  const WorkerServes prefill = ServedFor(Backend::kAuto, wire::Role::PREFILL);
#if KVP_HAVE_CUDA
  // The CUDA attention takes FP8 K and TurboNV V only, its cache write bf16 too: a cuda decode
  // worker must not register for a bf16 pool (it did, and failed every decode).
  ASSERT_TRUE(decode.cuda.has_value() && prefill.cuda.has_value());
  EXPECT_FALSE(decode.cuda->k_formats.Has(KvFormat::kBf16));
  EXPECT_FALSE(decode.cuda->v_formats.Has(KvFormat::kBf16));
  EXPECT_TRUE(prefill.cuda->k_formats.Has(KvFormat::kBf16));
#else
  EXPECT_FALSE(decode.cuda.has_value());
  EXPECT_FALSE(prefill.cuda.has_value());
#endif
}

TEST(CapabilitiesTest, ServedFormatsSurviveTheWireAndNameWhatIsMissing) {
  const OpCapabilities cuda_decode = kCudaCapabilities.Decode();
  capnp::MallocMessageBuilder message;
  auto served = message.initRoot<wire::ServedFormats>();
  ServedToWire(cuda_decode, served);
  const OpCapabilities back = ServedFromWire(served.asReader());
  EXPECT_EQ(back.k_formats.bits, cuda_decode.k_formats.bits);
  EXPECT_EQ(back.v_formats.bits, cuda_decode.v_formats.bits);
  EXPECT_EQ(back.head_dims, cuda_decode.head_dims);
  PoolSpec bf16_pool;
  bf16_pool.k_format = KvFormat::kBf16;
  bf16_pool.v_format = KvFormat::kBf16;
  const absl::Status s = CheckServes(back, bf16_pool);
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("K format bf16"));
  EXPECT_TRUE(CheckServes(back, PoolSpec()).ok());  // fp8_e4m3 + turbo3, head_dim 128
  EXPECT_TRUE(back.mla);
  EXPECT_TRUE(CheckServes(back, MlaPoolSpec(4, 64, true)).ok());
  OpCapabilities no_mla = back;
  no_mla.mla = false;
  EXPECT_TRUE(absl::IsUnimplemented(CheckServes(no_mla, MlaPoolSpec(4, 64, true))));
}

}  // namespace
}  // namespace kvp::testing
