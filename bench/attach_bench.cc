#include "bench/attach_bench.h"

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "kvpool/arena/cuda_arena.h"
#include "kvpool/arena/fd_channel.h"

namespace kvp::bench {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int AttachChild(const std::string& path) {
  // A worker has its CUDA context before it attaches; create it first so it is not counted.
  const auto context_start = std::chrono::steady_clock::now();
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) return 1;
  const double context_ms = MsSince(context_start);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<FdPeer> peer = ConnectFdChannel(path);
  if (!peer.ok()) return 1;
  auto arena = peer->ReceiveArena(60000);
  if (!arena.ok()) {
    std::fprintf(stderr, "attach-child: %s\n", arena.status().ToString().c_str());
    return 1;
  }
  const auto received = std::chrono::steady_clock::now();
  auto mapping = CudaArenaMapping::Map(arena->first.device, arena->first.chunk_bytes,
                                       std::move(arena->second));
  if (!mapping.ok()) {
    std::fprintf(stderr, "attach-child: %s\n", mapping.status().ToString().c_str());
    return 1;
  }
  const double attach_ms = MsSince(received), total_ms = MsSince(start);
  return peer->Send(absl::StrCat(attach_ms, " ", total_ms, " ", context_ms)).ok() ? 0 : 1;
}

absl::StatusOr<AttachResult> RunAttachBench(const std::string& self, double arena_gib,
                                            double chunk_gib) {
  AttachResult r;
  r.arena_gib = arena_gib;
  r.chunk_gib = chunk_gib;
  const uint64_t chunk = static_cast<uint64_t>(chunk_gib * (1ull << 30));
  const uint64_t total = static_cast<uint64_t>(arena_gib * (1ull << 30));
  std::fprintf(stderr, "attach: creating a %.0f GiB cuda arena in %.2f GiB chunks\n", arena_gib,
               chunk_gib);
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(CudaArena arena, CudaArena::Create(0, chunk, total, total));
  r.create_ms = MsSince(start);
  r.chunks = static_cast<int>(arena.chunk_sizes().size());
  const std::string path = absl::StrCat("/tmp/kvpool-attach-", ::getpid(), ".sock");
  ASSIGN_OR_RETURN(FdChannelServer server,
                   FdChannelServer::Listen(path, AllowList{{::getuid()}, {}}));
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl(self.c_str(), self.c_str(), "attach-child", path.c_str(), nullptr);
    ::_exit(127);
  }
  ASSIGN_OR_RETURN(FdPeer peer, server.Accept(60000));
  ArenaDescription d;
  d.kind = ArenaKind::kCuda;
  d.device = 0;
  d.chunk_bytes = arena.chunk_sizes();
  ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, arena.ExportFds());
  std::vector<int> raw;
  for (const UniqueFd& fd : fds) raw.push_back(fd.get());
  RETURN_IF_ERROR(peer.SendArena(d, raw));
  ASSIGN_OR_RETURN(const std::string report, peer.Receive(120000));
  std::vector<std::string> parts = absl::StrSplit(report, ' ');
  if (parts.size() != 3 || !absl::SimpleAtod(parts[0], &r.attach_ms) ||
      !absl::SimpleAtod(parts[1], &r.connect_to_mapped_ms) ||
      !absl::SimpleAtod(parts[2], &r.context_ms)) {
    return absl::InternalError(absl::StrCat("attach child reported '", report, "'"));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return r;
}

std::string AttachTable(const AttachResult& r) {
  return absl::StrFormat(
      "| cuda arena | chunks | create (kvpoold) | attach (other process) | connect to mapped | its "
      "CUDA context |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n"
      "| %.0f GiB | %d x %.2f GiB | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n",
      r.arena_gib, r.chunks, r.chunk_gib, r.create_ms, r.attach_ms, r.connect_to_mapped_ms,
      r.context_ms);
}

std::string AttachJson(const AttachResult& r, const std::string& date, const std::string& device) {
  return absl::StrFormat(
      "{\n  \"benchmark\": \"attach\",\n  \"date\": \"%s\",\n  \"device\": \"%s\",\n"
      "  \"arena_gib\": %.1f,\n  \"chunk_gib\": %.2f,\n  \"chunks\": %d,\n  \"create_ms\": %.2f,\n"
      "  \"attach_ms\": %.2f,\n  \"connect_to_mapped_ms\": %.2f,\n  \"child_context_ms\": "
      "%.2f\n}\n",
      date, device, r.arena_gib, r.chunk_gib, r.chunks, r.create_ms, r.attach_ms,
      r.connect_to_mapped_ms, r.context_ms);
}

}  // namespace kvp::bench
