#include "bench/mla_kernel_bench.h"

#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/gpu_timer.h"
#include "kernels/cuda_ops.h"
#include "kvpool/format/mla_latent.h"
#include "tests/testing/mla_layer.h"
#include "tests/testing/test_data.h"

namespace kvp::bench {

using testing::RandomBf16;

absl::Status MeasureMlaKernels(cudaStream_t stream, bool quick, std::mt19937_64& rng,
                               KernelReport& report) {
  const int block = 64;
  const int64_t tokens = quick ? 16384 : 163840;
  const int64_t blocks = tokens / block;
  ASSIGN_OR_RETURN(DeviceBuffer arena,
                   DeviceBuffer::Allocate(blocks * testing::MlaLayerStride(block)));
  const LayerCache cache = testing::MlaLayer(arena.get<uint8_t>(), blocks, block);
  KernelBenchProgress(absl::StrCat("MLA cache write, ", tokens, " tokens"));
  ASSIGN_OR_RETURN(DeviceBuffer latent, ToDevice(RandomBf16(rng, size_t(tokens) * 512, 1.0f)));
  ASSIGN_OR_RETURN(DeviceBuffer rope, ToDevice(RandomBf16(rng, size_t(tokens) * 64, 1.0f)));
  std::vector<int64_t> all(tokens);
  std::iota(all.begin(), all.end(), 0);
  ASSIGN_OR_RETURN(DeviceBuffer dslots, ToDevice(all));
  const MlaCacheWriteParams w{.cache = cache, .latent = latent.get<Bf16>(),
                              .rope = rope.get<Bf16>(), .slots = dslots.get<int64_t>(),
                              .num_tokens = static_cast<int32_t>(tokens)};
  ASSIGN_OR_RETURN(Timing tw, TimeMedian([&](int) { return MlaCacheWriteCuda(w, stream); },
                                         stream, 3, 20));
  report.rows.push_back({"mla_cache_write", absl::StrFormat("tokens=%d fp8_ds_mla", tokens),
                         tw.median_us, double(tokens) * (576 * 2 + 8 + kMlaTokenBytes), {}});

  struct Shape {
    int batch, s_q, heads;
  };
  const int topk = 2048;
  for (const Shape& sh : std::vector<Shape>{{128, 2, 128}, {128, 1, 128}, {1, 1, 128},
                                            {128, 1, 64}, {128, 1, 32}, {128, 1, 16}}) {
    if (quick && sh.batch > 32) continue;
    KernelBenchProgress(absl::StrFormat("sparse MLA decode batch=%d s_q=%d heads=%d", sh.batch, sh.s_q,
                             sh.heads));
    const int rows = sh.batch * sh.s_q;
    std::vector<int32_t> slots(size_t(rows) * topk);
    for (int r = 0; r < rows; ++r) {  // distinct random slots per row (partial shuffle)
      for (int k = 0; k < topk; ++k) {
        std::swap(all[k], all[k + rng() % (tokens - k)]);
        slots[size_t(r) * topk + k] = static_cast<int32_t>(all[k]);
      }
    }
    ASSIGN_OR_RETURN(DeviceBuffer ds, ToDevice(slots));
    ASSIGN_OR_RETURN(DeviceBuffer q,
                     ToDevice(RandomBf16(rng, size_t(rows) * sh.heads * 576, 0.1f)));
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(size_t(rows) * sh.heads * 512 * 2));
    ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Allocate(size_t(rows) * sh.heads * 4));
    const SparseMlaDecodeParams p{.cache = cache, .q = q.get<Bf16>(), .slots = ds.get<int32_t>(),
                                  .batch = sh.batch, .s_q = sh.s_q, .heads = sh.heads,
                                  .topk = topk, .softmax_scale = kDeepSeekV32SoftmaxScale,
                                  .out = out.get<Bf16>(), .lse = lse.get<float>()};
    ASSIGN_OR_RETURN(Timing t,
                     TimeMedian([&](int) { return SparseMlaDecodeCuda(p, stream); }, stream,
                                3, 20));
    const double flops = 2.0 * rows * sh.heads * topk * (576 + 512);
    const double bytes = double(rows) * topk * kMlaTokenBytes + double(rows) * sh.heads * (576 + 512) * 2;
    report.rows.push_back(
        {"sparse_mla_decode",
         absl::StrFormat("batch=%d s_q=%d heads=%d topk=%d ctx=%d", sh.batch, sh.s_q, sh.heads,
                         topk, tokens),
         t.median_us,
         bytes,
         {{"tflops", flops / (t.median_us * 1e-6) / 1e12},
          {"us_per_head", t.median_us / sh.heads}}});
  }
  return absl::OkStatus();
}

}  // namespace kvp::bench
