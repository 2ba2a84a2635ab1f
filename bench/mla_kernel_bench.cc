#include "bench/mla_kernel_bench.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/gpu_timer.h"
#include "kernels/cuda_ops.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/layout/block_layout.h"
#include "tests/testing/mla_layer.h"
#include "tests/testing/test_data.h"

namespace kvp::bench {
namespace {

using testing::RandomBf16;

// One DeepSeek-V3.2 decode layer at batch 1 over an MLA pool's layer of `tokens` tokens: indexer
// logits (64 heads) -> top-2048 -> their slots -> sparse MLA decode of 128 heads, the four kernels
// a worker runs per layer, timed together.
absl::Status MeasureMlaDecodeLayer(cudaStream_t stream, int64_t tokens, std::mt19937_64& rng,
                                   KernelReport& report) {
  const int block = 64, heads = 128, topk = 2048;
  const int32_t blocks = static_cast<int32_t>(tokens / block);
  ASSIGN_OR_RETURN(const BlockLayout layout, BlockLayout::Create(MlaPoolSpec(1, block, true)));
  ASSIGN_OR_RETURN(DeviceBuffer arena, DeviceBuffer::Allocate(blocks * layout.block_stride()));
  const LayerCache cache = layout.Layer(arena.get<uint8_t>(), blocks, 0);
  KernelBenchProgress(absl::StrCat("DeepSeek-V3.2 decode layer, batch 1, ", tokens, " tokens"));
  ASSIGN_OR_RETURN(DeviceBuffer rows, ToDevice(RandomBf16(rng, size_t(tokens) * 576, 1.0f)));
  ASSIGN_OR_RETURN(DeviceBuffer index_k, ToDevice(RandomBf16(rng, size_t(tokens) * 128, 1.0f)));
  std::vector<int64_t> all(tokens);
  std::iota(all.begin(), all.end(), 0);
  ASSIGN_OR_RETURN(DeviceBuffer slots, ToDevice(all));
  RETURN_IF_ERROR(MlaCacheWriteCuda(MlaRowsWrite(cache, rows.get<Bf16>(), index_k.get<Bf16>(),
                                                 slots.get<int64_t>(),
                                                 static_cast<int32_t>(tokens)),
                                    stream));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);  // a fragmented block table
  const std::vector<int32_t> len = {static_cast<int32_t>(tokens)};
  ASSIGN_OR_RETURN(DeviceBuffer d_table, ToDevice(table));
  ASSIGN_OR_RETURN(DeviceBuffer d_len, ToDevice(len));
  ASSIGN_OR_RETURN(DeviceBuffer index_q, ToDevice(RandomBf16(rng, 64 * 128, 1.0f)));
  ASSIGN_OR_RETURN(DeviceBuffer weights, ToDevice(std::vector<float>(64, 0.125f)));
  ASSIGN_OR_RETURN(DeviceBuffer q, ToDevice(RandomBf16(rng, size_t(heads) * 576, 0.1f)));
  ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Allocate(size_t(tokens) * 4));
  ASSIGN_OR_RETURN(DeviceBuffer positions, DeviceBuffer::Allocate(topk * 4));
  ASSIGN_OR_RETURN(DeviceBuffer selected, DeviceBuffer::Allocate(topk * 4));
  ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(size_t(heads) * 512 * 2));
  ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Allocate(size_t(heads) * 4));
  CudaWorkspace topk_ws, decode_ws;
  auto layer = [&](int) -> absl::Status {
    RETURN_IF_ERROR(IndexerLogitsCuda(
        IndexerLogitsParams{.cache = cache, .index_q = index_q.get<Bf16>(),
                            .head_weights = weights.get<float>(),
                            .block_tables = d_table.get<int32_t>(), .block_table_stride = blocks,
                            .seq_lens = d_len.get<int32_t>(), .logits = logits.get<float>(),
                            .logits_stride = static_cast<int32_t>(tokens), .num_seqs = 1,
                            .num_heads = 64},
        stream));
    RETURN_IF_ERROR(TopkCuda(TopkParams{.scores = logits.get<float>(),
                                        .lengths = d_len.get<int32_t>(),
                                        .indices = positions.get<int32_t>(),
                                        .scores_stride = static_cast<int32_t>(tokens),
                                        .num_rows = 1, .k = topk},
                             topk_ws, stream));
    RETURN_IF_ERROR(SlotsOfPositionsCuda(
        SlotsOfPositionsParams{.positions = positions.get<int32_t>(),
                               .block_tables = d_table.get<int32_t>(),
                               .block_table_stride = blocks, .block_size = block,
                               .slots = selected.get<int32_t>(), .rows = 1, .k = topk},
        stream));
    return SparseMlaDecodeCuda(
        SparseMlaDecodeParams{.cache = cache, .q = q.get<Bf16>(), .slots = selected.get<int32_t>(),
                              .batch = 1, .s_q = 1, .heads = heads, .topk = topk,
                              .softmax_scale = kDeepSeekV32SoftmaxScale,
                              .out = out.get<Bf16>(), .lse = lse.get<float>()},
        decode_ws, stream);
  };
  ASSIGN_OR_RETURN(Timing t, TimeMedian(layer, stream, 3, 20));
  const double bytes = double(tokens) * (128 + 4) + double(topk) * kMlaTokenBytes;
  report.rows.push_back({"mla_decode_layer",
                         absl::StrFormat("batch=1 ctx=%d index_heads=64 topk=%d heads=%d", tokens,
                                         topk, heads),
                         t.median_us, bytes, {}});
  return absl::OkStatus();
}

}  // namespace

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
    KernelBenchProgress(absl::StrFormat("sparse MLA decode batch=%d s_q=%d heads=%d", sh.batch,
                                        sh.s_q, sh.heads));
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
    CudaWorkspace workspace;  // grown by the first (untimed) run: the splits' partial results
    ASSIGN_OR_RETURN(Timing t,
                     TimeMedian([&](int) { return SparseMlaDecodeCuda(p, workspace, stream); },
                                stream, 3, 20));
    const double flops = 2.0 * rows * sh.heads * topk * (576 + 512);
    const double bytes =
        double(rows) * topk * kMlaTokenBytes + double(rows) * sh.heads * (576 + 512) * 2;
    std::vector<std::pair<std::string, double>> notes = {
        {"tflops", flops / (t.median_us * 1e-6) / 1e12}, {"us_per_head", t.median_us / sh.heads}};
    if (sh.batch == 1) {  // what the split of one row's top-k over CTAs buys: fewer of them
      for (const int max_splits : {8, 16}) {
        SparseMlaDecodeParams capped = p;
        capped.max_splits = max_splits;
        auto run = [&](int) { return SparseMlaDecodeCuda(capped, workspace, stream); };
        ASSIGN_OR_RETURN(Timing tc, TimeMedian(run, stream, 3, 20));
        notes.push_back({absl::StrFormat("max_splits_%d_us", max_splits), tc.median_us});
      }
    }
    report.rows.push_back({"sparse_mla_decode",
                           absl::StrFormat("batch=%d s_q=%d heads=%d topk=%d ctx=%d", sh.batch,
                                           sh.s_q, sh.heads, topk, tokens),
                           t.median_us, bytes, std::move(notes)});
  }
  return MeasureMlaDecodeLayer(stream, tokens, rng, report);
}

}  // namespace kvp::bench
