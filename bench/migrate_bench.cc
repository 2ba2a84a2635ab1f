#include "bench/migrate_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/gpu_timer.h"
#include "kernels/common/cuda_status.h"
#include "kvpool/arena/cuda_arena.h"
#include "kvpool/layout/block_layout.h"
#include "worker/cuda_executor.h"
#include "worker/migration.h"
#include "worker/nccl_transport.h"

namespace kvp::bench {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr int kRuns = 20;

// A DeepSeek-like pool: 8 layers of fp8 K, turbo3 V and the indexer, blocks of 64 tokens.
PoolSpec BenchSpec() {
  PoolSpec spec;
  spec.num_layers = 8;
  spec.indexer = true;
  return spec;
}

// Median wall time of `run` (which returns once its copy is done), after two warm-up runs.
absl::StatusOr<double> MedianMs(const std::function<absl::Status()>& run) {
  std::vector<double> ms;
  for (int i = 0; i < kRuns + 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(run());
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// `n` moves: contiguous (block i onto block i) or fragmented (random distinct blocks on both sides).
std::vector<BlockCopyPair> Moves(int64_t n, int64_t arena_blocks, bool fragmented, uint64_t seed) {
  std::vector<int32_t> source(arena_blocks), target(arena_blocks);
  std::iota(source.begin(), source.end(), 0);
  std::iota(target.begin(), target.end(), 0);
  if (fragmented) {
    std::mt19937_64 rng(seed);
    std::shuffle(source.begin(), source.end(), rng);
    std::shuffle(target.begin(), target.end(), rng);
  }
  std::vector<BlockCopyPair> moves;
  for (int64_t i = 0; i < n; ++i) moves.emplace_back(source[i], target[i]);
  return moves;
}

// Raw NCCL between the two GPUs: one ncclSend/ncclRecv of `bytes` between a communicator per GPU
// of this process, wall-timed median (the peer path's NCCL baseline).
absl::StatusOr<double> RawNcclMs(const NcclLibrary& nccl, int source_gpu, int target_gpu,
                                 const uint8_t* from, uint8_t* to, size_t bytes) {
  ncclUniqueId id;
  if (nccl.GetUniqueId(&id) != ncclSuccess) return absl::UnavailableError("ncclGetUniqueId");
  ncclComm_t comms[2] = {nullptr, nullptr};
  ncclResult_t results[2] = {ncclSuccess, ncclSuccess};
  {
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        cudaSetDevice(rank == 0 ? source_gpu : target_gpu);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        results[rank] = nccl.CommInitRankConfig(&comms[rank], 2, id, rank, &config);
      });
    }
    for (std::thread& t : ranks) t.join();
  }
  for (int rank = 0; rank < 2; ++rank) {
    if (results[rank] != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclCommInitRank: ",
                                                 nccl.Describe(results[rank], comms[rank])));
    }
  }
  cudaStream_t streams[2];
  for (int rank = 0; rank < 2; ++rank) {
    KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank == 0 ? source_gpu : target_gpu));
    KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&streams[rank], cudaStreamNonBlocking));
  }
  absl::StatusOr<double> ms = MedianMs([&]() -> absl::Status {
    nccl.GroupStart();
    nccl.Send(from, bytes, ncclUint8, 1, comms[0], streams[0]);
    nccl.Recv(to, bytes, ncclUint8, 0, comms[1], streams[1]);
    if (const ncclResult_t r = nccl.GroupEnd(); r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("raw send/recv: ", nccl.Describe(r, comms[0])));
    }
    for (cudaStream_t s : streams) KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  });
  for (int rank = 0; rank < 2; ++rank) {
    nccl.CommAbort(comms[rank]);
    cudaStreamDestroy(streams[rank]);
  }
  return ms;
}

// The nccl transport's own path: a sender of the source arena and a receiver of the target arena
// (worker/nccl_transport.h), each on its thread as on its worker; the link is opened in the
// warm-up and reused after. Wall time from both starting to both done.
class NcclPair {
 public:
  static absl::StatusOr<std::unique_ptr<NcclPair>> Create(OwnArena source, OwnArena target,
                                                          uint64_t source_chunk,
                                                          uint64_t target_chunk) {
    auto pair = std::unique_ptr<NcclPair>(new NcclPair);
    ASSIGN_OR_RETURN(pair->sender_, NcclTransport::Create(source));
    ASSIGN_OR_RETURN(pair->receiver_, NcclTransport::Create(target));
    pair->source_chunk_ = source_chunk;
    pair->target_chunk_ = target_chunk;
    return pair;
  }

  absl::Status Move(const std::vector<BlockCopyPair>& moves) {
    MigrateWork receive = Work(moves, wire::TransferSide::RECEIVE);
    MigrateWork send = Work(moves, wire::TransferSide::SEND);
    if (!open_) {
      ASSIGN_OR_RETURN(send.link->rendezvous, receiver_->Open(receive));
    }
    absl::Status sent;
    std::thread sender([&] { sent = sender_->Send(send); });
    const absl::Status received = receiver_->Receive(receive);
    sender.join();
    RETURN_IF_ERROR(received);
    RETURN_IF_ERROR(sent);
    open_ = true;
    return absl::OkStatus();
  }

 private:
  NcclPair() = default;
  MigrateWork Work(const std::vector<BlockCopyPair>& moves, wire::TransferSide side) const {
    MigrateWork w;
    w.transport = wire::Transport::NCCL;
    w.moves = moves;
    w.link = LinkWork{.side = side, .id = 1, .fresh = !open_, .rendezvous = "", .token = "",
                      .deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60),
                      .source_chunk_bytes = source_chunk_, .target_chunk_bytes = target_chunk_};
    return w;
  }

  std::unique_ptr<NcclTransport> sender_, receiver_;
  uint64_t source_chunk_ = 0, target_chunk_ = 0;
  bool open_ = false;
};

// The shapes a migration bench moves: `blocks` blocks, contiguous or random on both sides.
struct MoveShape {
  const char* name;
  int64_t blocks;
  bool fragmented;
};

// Times `move` on each shape's moves (wall time, MedianMs) and adds a case each, named by
// `path_of(runs)`, against the raw baseline's `raw_gbs`.
absl::Status AddShapeCases(const std::vector<MoveShape>& shapes, int64_t arena_blocks,
                           int64_t stride, double raw_gbs,
                           const std::function<const char*(int64_t runs)>& path_of,
                           const std::function<absl::Status(const std::vector<BlockCopyPair>&)>& move,
                           MigrateReport& report) {
  for (const MoveShape& shape : shapes) {
    const std::vector<BlockCopyPair> moves =
        Moves(shape.blocks, arena_blocks, shape.fragmented, 7);
    const int64_t runs = static_cast<int64_t>(CoalesceRuns(moves).size());
    ASSIGN_OR_RETURN(const double ms, MedianMs([&] { return move(moves); }));
    const double bytes = double(shape.blocks * stride);
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    report.cases.push_back({.name = shape.name,
                            .path = path_of(runs),
                            .blocks = shape.blocks,
                            .runs = runs,
                            .bytes = bytes,
                            .median_ms = ms,
                            .gb_per_s = gbs,
                            .of_raw = gbs / raw_gbs});
    std::fprintf(stderr, "migrate: %s by %s done\n", shape.name, path_of(runs));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MigrateReport> RunMigrateBench(int source_gpu, int target_gpu) {
  MigrateReport report;
  report.source_gpu = source_gpu;
  report.target_gpu = target_gpu;
  cudaDeviceProp prop;
  KVP_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, target_gpu));
  report.device = prop.name;
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(BenchSpec()));
  const int64_t stride = layout.block_stride();
  report.block_bytes = stride;
  const uint64_t arena_bytes = kGiB + kGiB / 4;
  // kvpoold's two pools, and the receiving worker's view: its own arena mapped, the source's
  // imported through exported fds, as over the fd channel.
  ASSIGN_OR_RETURN(const uint64_t granularity, CudaArena::Granularity(source_gpu));
  const uint64_t chunk = (kGiB / 4 + granularity - 1) / granularity * granularity;
  std::fprintf(stderr, "migrate: two %.2f GiB cuda arenas on GPUs %d and %d, blocks of %lld B\n",
               double(arena_bytes) / kGiB, source_gpu, target_gpu, (long long)stride);
  ASSIGN_OR_RETURN(CudaArena source, CudaArena::Create(source_gpu, chunk, arena_bytes, arena_bytes));
  ASSIGN_OR_RETURN(CudaArena target, CudaArena::Create(target_gpu, chunk, arena_bytes, arena_bytes));
  ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, source.ExportFds());
  ASSIGN_OR_RETURN(CudaArenaMapping source_view,
                   CudaArenaMapping::Map(target_gpu, source.chunk_sizes(), std::move(fds)));
  const int64_t arena_blocks = static_cast<int64_t>(arena_bytes) / stride;
  // Real bytes, not zeros: the source filled with a pattern.
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(source_gpu));
  KVP_CUDA_RETURN_IF_ERROR(cudaMemset(source.base(), 0x5B, arena_blocks * stride));
  KVP_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(target_gpu));
  JobContext ctx{.spec = BenchSpec(), .num_blocks = arena_blocks, .model = {}};
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor,
                   CudaExecutor::Create(layout, target.base(), ctx, target_gpu));

  cudaStream_t stream;
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The baseline: one copy of the same bytes (cudaMemcpyPeer across GPUs), timed with events.
  double raw_gbs = 0;
  const int64_t gib_blocks = static_cast<int64_t>(kGiB) / stride;
  {
    const double bytes = double(gib_blocks * stride);
    ASSIGN_OR_RETURN(const Timing t, TimeMedian(
        [&](int) -> absl::Status {
          if (source_gpu == target_gpu) {
            KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(target.base(), source_view.base(), bytes,
                                                     cudaMemcpyDeviceToDevice, stream));
          } else {
            KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(target.base(), target_gpu, source.base(),
                                                         source_gpu, bytes, stream));
          }
          return absl::OkStatus();
        },
        stream, 3, kRuns));
    raw_gbs = bytes / (t.median_us * 1e-6) / 1e9;
    report.cases.push_back({.name = "1 GiB",
                            .path = source_gpu == target_gpu ? "cudaMemcpy (raw)"
                                                             : "cudaMemcpyPeer (raw)",
                            .blocks = gib_blocks,
                            .runs = 1,
                            .bytes = bytes,
                            .median_ms = t.median_us * 1e-3,
                            .gb_per_s = raw_gbs,
                            .of_raw = 1.0});
  }
  // The worker's own path, wall time from the call to the bytes in place (launches included).
  const std::vector<MoveShape> shapes = {
      {"1 GiB contiguous", gib_blocks, false},
      {"1 GiB fragmented", gib_blocks, true},
      {"64 MiB sequence, contiguous", (int64_t{64} << 20) / stride, false},
      {"64 MiB sequence, fragmented", (int64_t{64} << 20) / stride, true}};
  RETURN_IF_ERROR(AddShapeCases(
      shapes, arena_blocks, stride, raw_gbs,
      [](int64_t runs) {
        return runs <= static_cast<int64_t>(CudaExecutor::kMaxCopyEngineRuns)
                   ? "copy engine"
                   : "block move kernel";
      },
      [&](const std::vector<BlockCopyPair>& moves) {
        return executor->MoveBlocksFrom(source_view.base(), arena_blocks, moves);
      },
      report));
  cudaStreamDestroy(stream);
  if (source_gpu == target_gpu) {
    std::fprintf(stderr, "migrate: NCCL needs two GPUs (it refuses two ranks on one); "
                         "run with --target_gpu=1 on a machine with two\n");
    return report;
  }
  absl::StatusOr<const NcclLibrary*> nccl = LoadNccl();
  if (!nccl.ok()) {
    std::fprintf(stderr, "migrate: no NCCL cases: %s\n", nccl.status().ToString().c_str());
    return report;
  }
  ASSIGN_OR_RETURN(const double raw_ms, RawNcclMs(**nccl, source_gpu, target_gpu, source.base(),
                                                  target.base(), gib_blocks * stride));
  const double raw_nccl_gbs = double(gib_blocks * stride) / (raw_ms * 1e-3) / 1e9;
  report.cases.push_back({.name = "1 GiB", .path = "ncclSend/ncclRecv (raw)", .blocks = gib_blocks,
                          .runs = 1, .bytes = double(gib_blocks * stride), .median_ms = raw_ms,
                          .gb_per_s = raw_nccl_gbs, .of_raw = 1.0});
  ASSIGN_OR_RETURN(std::unique_ptr<NcclPair> pair,
                   NcclPair::Create(OwnArena{.base = source.base(), .num_blocks = arena_blocks,
                                             .block_stride = stride, .device = source_gpu},
                                    OwnArena{.base = target.base(), .num_blocks = arena_blocks,
                                             .block_stride = stride, .device = target_gpu},
                                    source.chunk_sizes().at(0), target.chunk_sizes().at(0)));
  RETURN_IF_ERROR(AddShapeCases(
      shapes, arena_blocks, stride, raw_nccl_gbs,
      [](int64_t runs) {
        return runs <= static_cast<int64_t>(NcclTransport::kMaxDirectRuns)
                   ? "nccl, grouped sends"
                   : "nccl, staged gather/scatter";
      },
      [&](const std::vector<BlockCopyPair>& moves) { return pair->Move(moves); }, report));
  return report;
}

std::string MigrateTable(const MigrateReport& r) {
  std::string out = absl::StrFormat(
      "%s, pool on GPU %d -> pool on GPU %d, blocks of %lld bytes\n"
      "| transfer | path | blocks | runs | median | GB/s moved | of raw |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
      r.device, r.source_gpu, r.target_gpu, (long long)r.block_bytes);
  for (const MigrateCase& c : r.cases) {
    absl::StrAppendFormat(&out, "| %s | %s | %lld | %lld | %.3f ms | %.1f | %.0f%% |\n", c.name,
                          c.path, (long long)c.blocks, (long long)c.runs, c.median_ms, c.gb_per_s,
                          100 * c.of_raw);
  }
  return out;
}

std::string MigrateJson(const MigrateReport& r, const std::string& date) {
  std::string out = absl::StrFormat(
      "{\n  \"benchmark\": \"migrate\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n"
      "  \"source_gpu\": %d,\n  \"target_gpu\": %d,\n  \"block_bytes\": %lld,\n  \"cases\": [\n",
      date, r.device, r.source_gpu, r.target_gpu, (long long)r.block_bytes);
  for (size_t i = 0; i < r.cases.size(); ++i) {
    const MigrateCase& c = r.cases[i];
    absl::StrAppendFormat(&out,
                          "    {\"name\": \"%s\", \"path\": \"%s\", \"blocks\": %lld, \"runs\": "
                          "%lld, \"bytes\": %.0f, \"median_ms\": %.4f, \"gb_per_s\": %.2f, "
                          "\"of_raw\": %.4f}%s\n",
                          c.name, c.path, (long long)c.blocks, (long long)c.runs, c.bytes,
                          c.median_ms, c.gb_per_s, c.of_raw, i + 1 < r.cases.size() ? "," : "");
  }
  out += "  ]\n}\n";
  return out;
}

}  // namespace kvp::bench
