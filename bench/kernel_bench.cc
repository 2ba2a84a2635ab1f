#include "bench/kernel_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "bench/gpu_pool.h"
#include "bench/gpu_timer.h"
#include "bench/launch_floor.h"
#include "bench/mla_kernel_bench.h"
#include "bench/read_floor.h"
#include "kernels/cuda_ops.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kernels/topk/topk_launch.h"
#include "kvpool/format/indexer_quant.h"
#include "kvpool/format/kv_format_names.h"
#include "tests/testing/test_data.h"

namespace kvp::bench {

void KernelBenchProgress(const std::string& what) {
  std::fprintf(stderr, "kernels: %s\n", what.c_str());
}

namespace {

using testing::RandomBf16;

constexpr int kIndexTokens = 163840;

void Progress(const std::string& what) { KernelBenchProgress(what); }

PoolSpec DecodeSpec(KvFormat v, bool indexer, int kv_heads = 8) {
  PoolSpec spec;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = 128;
  spec.block_size = 64;
  spec.v_format = v;
  spec.indexer = indexer;
  return spec;
}

// A dense decode configuration: the targets' shape (32/8 heads, head_dim 128, block 64, turbo3)
// or one of the others the kernel serves.
struct DenseShape {
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int block_size = 64;
  KvFormat v_format = KvFormat::kTurbo3;

  PoolSpec Spec() const {
    PoolSpec spec = DecodeSpec(v_format, false, kv_heads);
    spec.head_dim = head_dim;
    spec.block_size = block_size;
    return spec;
  }
};

// Dense decode shapes beside the targets', one setting changed at a time, at batch 32 x 8,192
// tokens: GQA groups 1 to 16 (16 takes the heads-as-rows kernel), head_dim 64 and 256, blocks of
// 16 and 32 tokens, turbo2 and turbo4 values.
std::vector<DenseShape> OtherDenseShapes() {
  std::vector<DenseShape> shapes;
  for (int q_heads : {8, 16, 64, 128}) shapes.push_back(DenseShape{.q_heads = q_heads});
  for (int head_dim : {64, 256}) shapes.push_back(DenseShape{.head_dim = head_dim});
  for (int block : {16, 32}) shapes.push_back(DenseShape{.block_size = block});
  for (KvFormat v : {KvFormat::kTurbo2, KvFormat::kTurbo4})
    shapes.push_back(DenseShape{.v_format = v});
  return shapes;
}

// How the top-k search decides the rows of `scores` (`lens.size()` rows of `stride`): how many it
// finds in the candidate list after two passes, and how many take a third pass. A top-k row of the
// table depends on them (TopkSearchOf); they are its notes.
std::vector<std::pair<std::string, double>> TopkSearchNotes(const std::vector<float>& scores,
                                                            const std::vector<int32_t>& lens,
                                                            int stride, int k) {
  TopkParams host{
      scores.data(), lens.data(), nullptr, stride, static_cast<int32_t>(lens.size()), k};
  int list = 0, third_pass = 0;
  for (int r = 0; r < host.num_rows; ++r) {
    const TopkSearch search = TopkSearchOf(host, r);
    list += search.from_list;
    third_pass += search.passes == 3;
  }
  return {{"list_rows", list}, {"third_pass_rows", third_pass}};
}

double KvBytesPerToken(const PoolSpec& s) {
  return double(s.num_kv_heads) * (TraitsOf(s.k_format).TotalBytes(s.head_dim) +
                                   TraitsOf(s.v_format).TotalBytes(s.head_dim));
}

absl::StatusOr<double> MeasureCopyTbps(cudaStream_t stream) {
  const size_t bytes = size_t{2} << 30;
  ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(bytes));
  KVP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.get(), 0x5A, bytes, stream));
  ASSIGN_OR_RETURN(Timing t, TimeMedian(
                                 [&](int) -> absl::Status {
                                   KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
                                       b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
                                   return absl::OkStatus();
                                 },
                                 stream, 3, 20));
  return 2.0 * bytes / (t.median_us * 1e-6) / 1e12;
}

AttentionParams Attention(const GpuPool& pool, int seq0, int num_seqs, const Bf16* q, float* out,
                          int q_heads) {
  const int head_dim = pool.layout.spec().head_dim;
  AttentionParams a;
  a.cache = pool.Layer(0);
  a.q = q;
  a.block_tables = pool.table(seq0);
  a.block_table_stride = pool.blocks_per_seq;
  a.seq_lens = pool.lens(seq0);
  a.out = out;
  a.num_seqs = num_seqs;
  a.num_q_heads = q_heads;
  a.softmax_scale = DefaultSoftmaxScale(head_dim);
  a.max_seq_len = pool.seq_len;
  return a;
}

class Bench {
 public:
  Bench(cudaStream_t stream, bool quick) : stream_(stream), quick_(quick) {}

  // Each section draws its inputs from a seed of its own, so that running a subset of the
  // sections, or adding one, leaves the others' inputs as they were.
  void SeedFor(int section) { rng_.seed(20261130u + 7919u * static_cast<unsigned>(section)); }

  // The targets' three shapes, each with the floor of its reads (`loads_only_us`).
  absl::Status DenseDecode(KernelReport& report) {
    const std::pair<int, int> shapes[] = {{32, 8192}, {8, 32768}, {1, 131072}};
    for (auto [batch, ctx] : shapes) {
      ASSIGN_OR_RETURN(KernelRow row, DenseDecodeRow(batch, ctx, DenseShape{}, true));
      report.rows.push_back(row);
    }
    return absl::OkStatus();
  }

  absl::Status OtherShapes(KernelReport& report) {
    for (const DenseShape& shape : OtherDenseShapes()) {
      ASSIGN_OR_RETURN(KernelRow row, DenseDecodeRow(32, 8192, shape));
      report.rows.push_back(row);
    }
    return absl::OkStatus();
  }

  // With `read_floor`, also times loads alone of the same rows in the same order (read_floor.h),
  // in 128 / batch splits a sequence: 512 CTAs of two kv heads at 8 kv heads, as the decode plans
  // the targets' shapes.
  absl::StatusOr<KernelRow> DenseDecodeRow(int batch, int ctx, const DenseShape& shape,
                                           bool read_floor = false) {
    if (quick_) ctx /= 16;
    const std::string name = absl::StrFormat(
        "batch=%d ctx=%d q/kv=%d/%d d=%d fp8+%s block=%d", batch, ctx, shape.q_heads,
        shape.kv_heads, shape.head_dim, KvFormatName(shape.v_format), shape.block_size);
    Progress(absl::StrCat("paged decode ", name));
    const PoolSpec spec = shape.Spec();
    SyntheticConfig synth;
    ASSIGN_OR_RETURN(GpuPool pool, BuildGpuPool(spec, batch, ctx, synth, stream_));
    const size_t q_elems = size_t(batch) * shape.q_heads * shape.head_dim;
    ASSIGN_OR_RETURN(DeviceBuffer q, ToDevice(RandomBf16(rng_, q_elems, 1.0f)));
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(q_elems * 4));
    const PagedDecodeParams p{
        Attention(pool, 0, batch, q.get<Bf16>(), out.get<float>(), shape.q_heads), 0};
    ASSIGN_OR_RETURN(Timing t,
                     TimeMedian([&](int) { return PagedDecodeCuda(p, ws_, stream_); }, stream_));
    KernelRow row{
        "paged_decode", name, t.median_us, double(batch) * ctx * KvBytesPerToken(spec), {}};
    if (read_floor) {
      ASSIGN_OR_RETURN(DeviceBuffer sink, DeviceBuffer::Allocate(sizeof(uint32_t)));
      const int splits = std::max(1, 128 / batch);
      ASSIGN_OR_RETURN(Timing loads, TimeMedian(
                                         [&](int) {
                                           return LaunchDenseReadFloor(
                                               pool.Layer(0), pool.table(0), pool.blocks_per_seq,
                                               batch, splits, sink.get<uint32_t>(), stream_);
                                         },
                                         stream_));
      row.extra.push_back({"loads_only_us", loads.median_us});
    }
    return row;
  }

  absl::Status SparseV(KernelReport& report) {
    const int batch = 8, ctx = quick_ ? 4096 : 32768;
    Progress("sparse-V on needle data");
    const PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, false);
    SyntheticConfig synth;
    ASSIGN_OR_RETURN(GpuPool pool, BuildGpuPool(spec, batch, ctx, synth, stream_));
    std::vector<Bf16> q(size_t(batch) * 32 * 128);
    for (int s = 0; s < batch; ++s) {
      const int32_t target = static_cast<int32_t>(rng_() % ctx);
      const SyntheticNeedle needle{target, pool.tokens[size_t(s) * ctx + target], 1.0f};
      FillSyntheticQuery(synth, SyntheticShape{8, 32, 128}, 0, rng_(), &needle,
                         &q[size_t(s) * 32 * 128]);
    }
    ASSIGN_OR_RETURN(DeviceBuffer dq, ToDevice(q));
    ASSIGN_OR_RETURN(DeviceBuffer counter, DeviceBuffer::Allocate(sizeof(uint32_t)));
    std::vector<float> dense_out;
    double dense_us = 0;
    for (float tau : {0.0f, 1e-6f, 1e-3f}) {
      ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(q.size() * 4));
      PagedDecodeParams p{Attention(pool, 0, batch, dq.get<Bf16>(), out.get<float>(), 32), 0};
      p.attn.sparse_v_threshold = tau;
      ASSIGN_OR_RETURN(Timing t,
                       TimeMedian([&](int) { return PagedDecodeCuda(p, ws_, stream_); }, stream_));
      // One counted run for the skip rate.
      KVP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counter.get(), 0, 4, stream_));
      p.attn.skipped_tiles = counter.get<uint32_t>();
      RETURN_IF_ERROR(PagedDecodeCuda(p, ws_, stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // copies below use another stream
      uint32_t skipped = 0;
      RETURN_IF_ERROR(counter.CopyTo(&skipped, 4));
      std::vector<float> o(q.size());
      RETURN_IF_ERROR(out.CopyTo(o));
      const double tiles = double(batch) * 8 * (ctx / 16);
      KernelRow row{
          "paged_decode_sparse_v",
          absl::StrFormat("tau=%g batch=%d ctx=%d needles q/kv=32/8 fp8+turbo3", tau, batch, ctx),
          t.median_us,
          double(batch) * ctx * KvBytesPerToken(spec),
          {}};
      row.extra.push_back({"skip_rate", skipped / tiles});
      if (tau == 0.0f) {
        dense_out = o;
        dense_us = t.median_us;
      } else {
        row.extra.push_back({"speedup_vs_tau0", dense_us / t.median_us});
        double err = 0, ref = 0;
        for (size_t i = 0; i < o.size(); ++i) {
          err += std::pow(double(o[i]) - dense_out[i], 2);
          ref += double(dense_out[i]) * dense_out[i];
        }
        row.extra.push_back({"rel_l2_vs_tau0", std::sqrt(err / ref)});
      }
      if (tau == 0.0f) {
        // τ = 0 must be the dense kernel exactly: compare with a run that never saw τ.
        ASSIGN_OR_RETURN(DeviceBuffer out2, DeviceBuffer::Allocate(q.size() * 4));
        PagedDecodeParams plain{Attention(pool, 0, batch, dq.get<Bf16>(), out2.get<float>(), 32),
                                0};
        RETURN_IF_ERROR(PagedDecodeCuda(plain, ws_, stream_));
        KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
        std::vector<float> o2(q.size());
        RETURN_IF_ERROR(out2.CopyTo(o2));
        int differing = 0;
        for (size_t i = 0; i < o.size(); ++i) differing += std::memcmp(&o[i], &o2[i], 4) != 0;
        row.extra.push_back({"identical_to_dense", differing == 0 ? 1.0 : 0.0});
        row.extra.push_back({"differing_outputs", double(differing)});
      }
      report.rows.push_back(row);
    }
    return absl::OkStatus();
  }

  absl::Status IndexerTopkSparse(KernelReport& report) {
    // Batch 1 over 163,840 tokens: 8 sequences, rotated, so each timed run reads memory, not L2.
    const int copies = 8, ctx = quick_ ? 16384 : kIndexTokens;
    Progress("indexer / top-k / sparse decode, batch 1");
    const PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, true);
    SyntheticConfig synth;
    ASSIGN_OR_RETURN(GpuPool pool, BuildGpuPool(spec, copies, ctx, synth, stream_));
    ASSIGN_OR_RETURN(
        DeviceBuffer iq,
        ToDevice(RandomBf16(rng_, size_t(copies) * kIndexHeads * kIndexHeadDim, 1.0f)));
    std::vector<float> w(copies * kIndexHeads);
    for (float& x : w) x = 0.5f + (rng_() % 1000) / 1000.0f;
    ASSIGN_OR_RETURN(DeviceBuffer dw, ToDevice(w));
    ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Allocate(size_t(copies) * ctx * 4));
    auto indexer = [&](int i) {
      const int s = i % copies;
      IndexerLogitsParams p{pool.Layer(0),
                            iq.get<Bf16>() + s * kIndexHeads * kIndexHeadDim,
                            dw.get<float>() + s * kIndexHeads,
                            pool.table(s),
                            pool.blocks_per_seq,
                            pool.lens(s),
                            logits.get<float>() + size_t(s) * ctx,
                            ctx,
                            1,
                            kIndexHeads};
      return IndexerLogitsCuda(p, stream_);
    };
    ASSIGN_OR_RETURN(Timing ti, TimeMedian(indexer, stream_));
    for (int i = 0; i < copies; ++i) RETURN_IF_ERROR(indexer(i));  // fill every row of logits
    report.rows.push_back({"indexer_logits",
                           absl::StrFormat("batch=1 tokens=%d heads=64x128 fp8", ctx),
                           ti.median_us,
                           double(ctx) * (kIndexHeadDim + 4 + 4),
                           {}});

    ASSIGN_OR_RETURN(DeviceBuffer indices, DeviceBuffer::Allocate(size_t(copies) * 2048 * 4));
    const std::vector<int32_t> host_lens(copies, ctx);
    ASSIGN_OR_RETURN(DeviceBuffer lens, ToDevice(host_lens));
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // CopyTo uses another stream
    std::vector<float> host_logits(size_t(copies) * ctx);
    RETURN_IF_ERROR(logits.CopyTo(host_logits));
    // The same rows with the (k+1)-th largest score raised to the k-th: a tie at the boundary, so
    // no row is decided by two histogram passes alone.
    std::vector<float> tied_logits = host_logits;
    testing::TieAtTheKth(tied_logits, ctx, 2048);
    ASSIGN_OR_RETURN(DeviceBuffer tied, ToDevice(tied_logits));
    // Top-k of row s of `scores` into the indices of copy s.
    auto topk_row = [&](const DeviceBuffer& scores, int s, int k) {
      const TopkParams p{scores.get<float>() + size_t(s) * ctx,
                         lens.get<int32_t>() + s,
                         indices.get<int32_t>() + s * 2048,
                         ctx,
                         1,
                         k};
      return TopkCuda(p, ws_topk_, stream_);
    };
    // How the search decides the rows: notes on each row that times them.
    const auto search_256 = TopkSearchNotes(host_logits, host_lens, ctx, 256);
    const auto search_2048 = TopkSearchNotes(host_logits, host_lens, ctx, 2048);
    auto time_topk = [&](const DeviceBuffer& scores, int k, const std::string& what,
                         const std::vector<std::pair<std::string, double>>& notes) -> absl::Status {
      auto topk = [&](int i) { return topk_row(scores, i % copies, k); };
      ASSIGN_OR_RETURN(Timing tt, TimeMedian(topk, stream_));
      KernelRow row{"topk", absl::StrFormat("batch=1 n=%d k=%d%s", ctx, k, what), tt.median_us,
                    double(ctx) * 4 + k * 4.0, notes};
      report.rows.push_back(row);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(time_topk(logits, 256, "", search_256));
    RETURN_IF_ERROR(time_topk(logits, 2048, "", search_2048));
    RETURN_IF_ERROR(time_topk(tied, 2048, " tied at the k-th",
                              TopkSearchNotes(tied_logits, host_lens, ctx, 2048)));
    for (int s = 0; s < copies; ++s) {  // the selections of the untied rows, for sparse decode
      RETURN_IF_ERROR(topk_row(logits, s, 2048));
    }

    // Sparse decode over those 2048 selections, 32/8 heads, batch 1.
    ASSIGN_OR_RETURN(DeviceBuffer q, ToDevice(RandomBf16(rng_, size_t(copies) * 32 * 128, 1.0f)));
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(size_t(copies) * 32 * 128 * 4));
    auto sparse = [&](int i) {
      const int s = i % copies;
      SparseDecodeParams p{
          Attention(pool, s, 1, q.get<Bf16>() + s * 32 * 128, out.get<float>() + s * 32 * 128, 32),
          indices.get<int32_t>() + s * 2048, 2048};
      return SparseDecodeCuda(p, ws_, stream_);
    };
    ASSIGN_OR_RETURN(KernelRow sparse_row,
                     SparseDecodeBatch1Row(sparse, copies, 32, 8, 2048.0 * KvBytesPerToken(spec)));
    report.rows.push_back(sparse_row);

    // One decode layer: indexer -> top-k -> sparse decode, alone after the L2 eviction, and alone
    // in a CUDA graph. A decode step runs its layers back to back, so also per layer of eight in a
    // row (one per input copy: each reads data the others evicted), launched one by one (each
    // kernel's start overlaps the one before, across layers too) and as one graph (its launch paid
    // once for the eight): a lone layer in a graph also pays the graph's launch.
    auto layer = [&](int i) -> absl::Status {
      RETURN_IF_ERROR(indexer(i));
      RETURN_IF_ERROR(topk_row(logits, i % copies, 2048));
      return sparse(i);
    };
    auto step = [&](int) -> absl::Status {
      for (int s = 0; s < copies; ++s) RETURN_IF_ERROR(layer(s));
      return absl::OkStatus();
    };
    ASSIGN_OR_RETURN(Timing tl, TimeMedian(layer, stream_));
    KernelRow row{"decode_layer",
                  absl::StrFormat("batch=1 indexer %d tokens + top-2048 + sparse 32/8", ctx),
                  tl.median_us, ctx * 136.0 + 2048.0 * KvBytesPerToken(spec), search_2048};
    ASSIGN_OR_RETURN(Timing tstep, TimeMedian(step, stream_));
    row.extra.push_back({"step_layer_us", tstep.median_us / copies});
    absl::StatusOr<double> graph_us = TimeGraphs(layer, copies);
    absl::StatusOr<double> step_graph_us = TimeGraphs(step, 1);
    if (graph_us.ok() && step_graph_us.ok()) {
      row.extra.push_back({"cuda_graph_us", *graph_us});
      row.extra.push_back({"step_layer_graph_us", *step_graph_us / copies});
    } else {
      Progress(
          absl::StrCat("graph capture failed: ",
                       (graph_us.ok() ? step_graph_us.status() : graph_us.status()).ToString()));
    }
    report.rows.push_back(row);
    return absl::OkStatus();
  }

  // Sparse decode of one sequence, `run(i)` over input copy i % copies: alone after the L2
  // eviction, and per layer of `copies` in a row as a decode step runs them (the copies read
  // data of their own, none of it in L2; each launch's start overlaps the one before).
  absl::StatusOr<KernelRow> SparseDecodeBatch1Row(const std::function<absl::Status(int)>& run,
                                                  int copies, int q_heads, int kv_heads,
                                                  double bytes) {
    ASSIGN_OR_RETURN(Timing alone, TimeMedian(run, stream_));
    ASSIGN_OR_RETURN(Timing step, TimeMedian(
                                      [&](int) -> absl::Status {
                                        for (int s = 0; s < copies; ++s) RETURN_IF_ERROR(run(s));
                                        return absl::OkStatus();
                                      },
                                      stream_));
    return KernelRow{
        "sparse_decode",
        absl::StrFormat("batch=1 topk=2048 q/kv=%d/%d d=128 fp8+turbo3", q_heads, kv_heads),
        alone.median_us,
        bytes,
        {{"step_layer_us", step.median_us / copies}}};
  }

  // Times run(i) captured as CUDA graphs: one per variant i < variants (a graph bakes its pointers
  // in), replayed in rotation.
  absl::StatusOr<double> TimeGraphs(const std::function<absl::Status(int)>& run, int variants) {
    struct Execs {  // destroys the instantiated graphs on every way out
      std::vector<cudaGraphExec_t> all;
      ~Execs() {
        for (cudaGraphExec_t e : all) cudaGraphExecDestroy(e);
      }
    } execs;
    for (int v = 0; v < variants; ++v) {
      cudaGraph_t graph;
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      const absl::Status st = run(v);
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t instantiated =
          st.ok() ? cudaGraphInstantiate(&exec, graph, 0) : cudaSuccess;
      cudaGraphDestroy(graph);
      RETURN_IF_ERROR(st);
      KVP_CUDA_RETURN_IF_ERROR(instantiated);
      execs.all.push_back(exec);
    }
    ASSIGN_OR_RETURN(
        Timing t, TimeMedian(
                      [&](int i) -> absl::Status {
                        KVP_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(execs.all[i % variants], stream_));
                        return absl::OkStatus();
                      },
                      stream_));
    return t.median_us;
  }

  // Times the indexer over `batch` sequences of `ctx` tokens; their logits stay in `logits`.
  absl::StatusOr<KernelRow> IndexerRow(int batch, int ctx, DeviceBuffer& logits) {
    Progress(absl::StrCat("indexer batch ", batch, " x ", ctx, " tokens"));
    const PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, true, 1);
    SyntheticConfig synth;
    ASSIGN_OR_RETURN(GpuPool pool, BuildGpuPool(spec, batch, ctx, synth, stream_));
    ASSIGN_OR_RETURN(DeviceBuffer iq,
                     ToDevice(RandomBf16(rng_, size_t(batch) * kIndexHeads * kIndexHeadDim, 1.0f)));
    ASSIGN_OR_RETURN(DeviceBuffer dw, ToDevice(std::vector<float>(batch * kIndexHeads, 0.7f)));
    IndexerLogitsParams p{pool.Layer(0),
                          iq.get<Bf16>(),
                          dw.get<float>(),
                          pool.table(0),
                          pool.blocks_per_seq,
                          pool.lens(0),
                          logits.get<float>(),
                          ctx,
                          batch,
                          kIndexHeads};
    ASSIGN_OR_RETURN(Timing t,
                     TimeMedian([&](int) { return IndexerLogitsCuda(p, stream_); }, stream_));
    return KernelRow{"indexer_logits",
                     absl::StrFormat("batch=%d tokens=%d heads=64x128 fp8", batch, ctx),
                     t.median_us,
                     double(batch) * ctx * (kIndexHeadDim + 4 + 4),
                     {}};
  }

  absl::Status BatchedIndexerAndSparse(KernelReport& report) {
    {  // Many short sequences: the quick start's workload decodes 16 of 2,048 tokens.
      const int batch = 16, ctx = 2048;
      ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Allocate(size_t(batch) * ctx * 4));
      ASSIGN_OR_RETURN(KernelRow row, IndexerRow(batch, ctx, logits));
      report.rows.push_back(row);
    }
    {
      const int batch = 32, ctx = quick_ ? 4096 : 65536;
      ASSIGN_OR_RETURN(DeviceBuffer logits, DeviceBuffer::Allocate(size_t(batch) * ctx * 4));
      ASSIGN_OR_RETURN(KernelRow row, IndexerRow(batch, ctx, logits));
      report.rows.push_back(row);
      // Top-2048 of those logits, as a batched decode step selects them.
      Progress("top-k batch 32");
      ASSIGN_OR_RETURN(DeviceBuffer lens, ToDevice(std::vector<int32_t>(batch, ctx)));
      ASSIGN_OR_RETURN(DeviceBuffer indices, DeviceBuffer::Allocate(size_t(batch) * 2048 * 4));
      const TopkParams tp{
          logits.get<float>(), lens.get<int32_t>(), indices.get<int32_t>(), ctx, batch, 2048};
      ASSIGN_OR_RETURN(Timing tt,
                       TimeMedian([&](int) { return TopkCuda(tp, ws_topk_, stream_); }, stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // CopyTo uses another stream
      std::vector<float> host_logits(size_t(batch) * ctx);
      RETURN_IF_ERROR(logits.CopyTo(host_logits));
      report.rows.push_back(
          {"topk", absl::StrFormat("batch=%d n=%d k=2048", batch, ctx), tt.median_us,
           double(batch) * (ctx * 4.0 + 2048 * 4.0),
           TopkSearchNotes(host_logits, std::vector<int32_t>(batch, ctx), ctx, 2048)});
    }
    for (int q_heads : {32, 128}) {
      const int batch = quick_ ? 16 : 128, ctx = 8192, kv = q_heads == 128 ? 1 : 8;
      Progress(absl::StrCat("sparse decode batch ", batch, " heads ", q_heads));
      const PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, false, kv);
      SyntheticConfig synth;
      ASSIGN_OR_RETURN(GpuPool pool, BuildGpuPool(spec, batch, ctx, synth, stream_));
      std::vector<int32_t> idx(size_t(batch) * 2048);
      std::vector<int32_t> all(ctx);
      std::iota(all.begin(), all.end(), 0);
      for (int s = 0; s < batch; ++s) {
        std::shuffle(all.begin(), all.end(), rng_);
        std::copy(all.begin(), all.begin() + 2048, idx.begin() + size_t(s) * 2048);
      }
      ASSIGN_OR_RETURN(DeviceBuffer di, ToDevice(idx));
      ASSIGN_OR_RETURN(DeviceBuffer q,
                       ToDevice(RandomBf16(rng_, size_t(batch) * q_heads * 128, 1.0f)));
      ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Allocate(size_t(batch) * q_heads * 128 * 4));
      SparseDecodeParams p{Attention(pool, 0, batch, q.get<Bf16>(), out.get<float>(), q_heads),
                           di.get<int32_t>(), 2048};
      ASSIGN_OR_RETURN(Timing t,
                       TimeMedian([&](int) { return SparseDecodeCuda(p, ws_, stream_); }, stream_));
      report.rows.push_back(
          {"sparse_decode",
           absl::StrFormat("batch=%d topk=2048 q/kv=%d/%d d=128 fp8+turbo3", batch, q_heads, kv),
           t.median_us,
           double(batch) * 2048 * KvBytesPerToken(spec),
           {}});
      if (q_heads == 128) {  // batch 1 of 32/8 heads is timed with the decode layer
        auto one = [&](int i) {
          const size_t s = i % batch, heads = size_t(q_heads) * 128;
          SparseDecodeParams p1{Attention(pool, s, 1, q.get<Bf16>() + s * heads,
                                          out.get<float>() + s * heads, q_heads),
                                di.get<int32_t>() + s * 2048, 2048};
          return SparseDecodeCuda(p1, ws_, stream_);
        };
        ASSIGN_OR_RETURN(KernelRow row,
                         SparseDecodeBatch1Row(one, 8, q_heads, kv, 2048 * KvBytesPerToken(spec)));
        report.rows.push_back(row);
      }
    }
    return absl::OkStatus();
  }

  absl::Status CacheWrite(KernelReport& report) {
    const int tokens = quick_ ? 4096 : 32768, layers = 8;
    Progress(absl::StrCat("cache write ", tokens, " tokens x ", layers, " layers"));
    PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, true);
    spec.num_layers = layers;
    ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
    const int64_t blocks = tokens / spec.block_size;
    ASSIGN_OR_RETURN(DeviceBuffer arena, DeviceBuffer::Allocate(blocks * layout.block_stride()));
    const size_t row = 8 * 128;
    std::vector<DeviceBuffer> k, v, ik;
    for (int l = 0; l < layers; ++l) {
      ASSIGN_OR_RETURN(DeviceBuffer kb, ToDevice(RandomBf16(rng_, tokens * row, 1.0f)));
      ASSIGN_OR_RETURN(DeviceBuffer vb, ToDevice(RandomBf16(rng_, tokens * row, 1.0f)));
      ASSIGN_OR_RETURN(DeviceBuffer ib, ToDevice(RandomBf16(rng_, size_t(tokens) * 128, 1.0f)));
      k.push_back(std::move(kb));
      v.push_back(std::move(vb));
      ik.push_back(std::move(ib));
    }
    std::vector<int64_t> slots(tokens);
    std::iota(slots.begin(), slots.end(), 0);
    ASSIGN_OR_RETURN(DeviceBuffer ds, ToDevice(slots));
    ASSIGN_OR_RETURN(Timing t, TimeMedian(
                                   [&](int) -> absl::Status {
                                     for (int l = 0; l < layers; ++l) {
                                       CacheWriteParams p{
                                           layout.Layer(arena.get<uint8_t>(), blocks, l),
                                           k[l].get<Bf16>(),
                                           v[l].get<Bf16>(),
                                           ik[l].get<Bf16>(),
                                           ds.get<int64_t>(),
                                           tokens};
                                       RETURN_IF_ERROR(CacheWriteCuda(p, stream_));
                                     }
                                     return absl::OkStatus();
                                   },
                                   stream_, 3, 20));
    const double read = double(layers) * tokens * (2.0 * row * 2 + 128 * 2 + 8);
    const double written = double(layers) * tokens * (KvBytesPerToken(spec) + 132);
    report.rows.push_back(
        {"cache_write",
         absl::StrFormat("tokens=%d layers=%d kv=8 d=128 fp8+turbo3+indexer", tokens, layers),
         t.median_us,
         read + written,
         {}});
    return absl::OkStatus();
  }

  absl::Status BlockCopy(KernelReport& report) {
    Progress("block gather");
    PoolSpec spec = DecodeSpec(KvFormat::kTurbo3, true);
    spec.num_layers = 8;
    ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
    const int64_t blocks = quick_ ? 512 : 4096;
    const int moved = static_cast<int>(blocks / 4);
    ASSIGN_OR_RETURN(DeviceBuffer arena, DeviceBuffer::Allocate(blocks * layout.block_stride()));
    KVP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(arena.get(), 0x3C, arena.bytes(), stream_));
    ASSIGN_OR_RETURN(DeviceBuffer staging, DeviceBuffer::Allocate(moved * layout.block_stride()));
    std::vector<int32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    ASSIGN_OR_RETURN(DeviceBuffer dids, ToDevice(ids));
    ASSIGN_OR_RETURN(Timing t, TimeMedian(
                                   [&](int i) {
                                     BlockCopyParams p{arena.get<uint8_t>(),
                                                       blocks,
                                                       layout.block_stride(),
                                                       dids.get<int32_t>() + (i % 4) * moved,
                                                       moved,
                                                       staging.get<uint8_t>()};
                                     return GatherBlocksCuda(p, stream_);
                                   },
                                   stream_));
    report.rows.push_back({"block_gather",
                           absl::StrFormat("blocks=%d stride=%d", moved, layout.block_stride()),
                           t.median_us,
                           2.0 * moved * layout.block_stride(),
                           {}});
    return absl::OkStatus();
  }

  absl::Status Mla(KernelReport& report) { return MeasureMlaKernels(stream_, quick_, rng_, report); }

  // What the batch-1 rows pay before any work: empty kernels timed exactly as the kernels are.
  absl::Status LaunchFloor(KernelReport& report) {
    Progress("empty launches");
    ASSIGN_OR_RETURN(Timing one,
                     TimeMedian([&](int) { return LaunchEmptyKernel(stream_); }, stream_));
    report.rows.push_back(
        {"empty_launch",
         absl::StrFormat("1 kernel, %d CTAs x %d threads", kEmptyFirstCtas, kEmptyFirstThreads),
         one.median_us,
         0,
         {}});
    ASSIGN_OR_RETURN(Timing two,
                     TimeMedian([&](int) { return LaunchEmptyDependentPair(stream_); }, stream_));
    report.rows.push_back(
        {"empty_launch",
         absl::StrFormat("2 kernels, %d x %d then %d x %d threads (dependent launch)",
                         kEmptyFirstCtas, kEmptyFirstThreads, kEmptySecondCtas,
                         kEmptySecondThreads),
         two.median_us,
         0,
         {}});
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_;
  bool quick_;
  std::mt19937_64 rng_;
  CudaWorkspace ws_, ws_topk_;
};

}  // namespace

absl::StatusOr<KernelReport> RunKernelBench(const KernelBenchOptions& options) {
  for (const std::string& name : options.only) {
    if (std::find(std::begin(kKernelBenchSections), std::end(kKernelBenchSections), name) ==
        std::end(kKernelBenchSections)) {
      return absl::InvalidArgumentError(
          absl::StrCat("no kernel bench section '", name,
                       "'; sections: ", absl::StrJoin(kKernelBenchSections, ",")));
    }
  }
  auto wanted = [&](const char* section) {
    return options.only.empty() ||
           std::find(options.only.begin(), options.only.end(), section) != options.only.end();
  };
  KernelReport report;
  cudaDeviceProp prop;
  KVP_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  report.device = prop.name;
  cudaStream_t stream;
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Progress(absl::StrCat("device ", report.device, ", measuring copy bandwidth"));
  ASSIGN_OR_RETURN(report.copy_tbps, MeasureCopyTbps(stream));
  Bench bench(stream, options.quick);
  using Section = absl::Status (Bench::*)(KernelReport&);
  // In the order of kKernelBenchSections.
  const Section sections[] = {&Bench::DenseDecode,
                              &Bench::OtherShapes,
                              &Bench::SparseV,
                              &Bench::IndexerTopkSparse,
                              &Bench::BatchedIndexerAndSparse,
                              &Bench::CacheWrite,
                              &Bench::BlockCopy,
                              &Bench::LaunchFloor,
                              &Bench::Mla};
  static_assert(std::size(sections) == std::size(kKernelBenchSections));
  for (size_t i = 0; i < std::size(sections); ++i) {
    if (!wanted(kKernelBenchSections[i])) continue;
    bench.SeedFor(static_cast<int>(i));
    RETURN_IF_ERROR((bench.*sections[i])(report));
  }
  cudaStreamDestroy(stream);
  return report;
}

std::string KernelJson(const KernelReport& r, const std::string& date) {
  std::string out = absl::StrFormat(
      "{\n  \"benchmark\": \"kernels\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n"
      "  \"copy_tbps\": %.4f,\n  \"rows\": [\n",
      date, r.device, r.copy_tbps);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const KernelRow& row = r.rows[i];
    const double tbps = row.bytes / (row.median_us * 1e-6) / 1e12;
    std::string extra;
    for (const auto& [k, v] : row.extra)
      absl::StrAppend(&extra, absl::StrFormat(", \"%s\": %.6g", k, v));
    absl::StrAppend(
        &out, absl::StrFormat(
                  "    {\"op\": \"%s\", \"shape\": \"%s\", \"median_us\": %.3f, \"bytes\": %.0f, "
                  "\"tbps\": %.4f, \"fraction_of_copy\": %.4f%s}%s\n",
                  row.op, row.shape, row.median_us, row.bytes, tbps, tbps / r.copy_tbps, extra,
                  i + 1 < r.rows.size() ? "," : ""));
  }
  absl::StrAppend(&out, "  ]\n}\n");
  return out;
}

std::string KernelTable(const KernelReport& r) {
  std::string out = absl::StrFormat("%s, device-to-device copy %.2f TB/s (read + write)\n\n",
                                    r.device, r.copy_tbps);
  absl::StrAppend(&out,
                  "| op | shape | median µs | TB/s | of copy BW | notes |\n| --- | --- | ---: | "
                  "---: | ---: | --- |\n");
  for (const KernelRow& row : r.rows) {
    const double tbps = row.bytes / (row.median_us * 1e-6) / 1e12;
    std::string notes;
    for (const auto& [k, v] : row.extra) absl::StrAppend(&notes, absl::StrFormat("%s=%.4g ", k, v));
    const std::string rate =
        row.bytes > 0 ? absl::StrFormat("%.2f | %.0f%%", tbps, 100 * tbps / r.copy_tbps) : "- | -";
    absl::StrAppend(&out, absl::StrFormat("| %s | %s | %.1f | %s | %s|\n", row.op, row.shape,
                                          row.median_us, rate, notes));
  }
  return out;
}

}  // namespace kvp::bench
