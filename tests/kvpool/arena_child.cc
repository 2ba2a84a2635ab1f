// A separate process for the fd channel tests (started with fork + exec):
//   kvpool_arena_child read-write PATH EXPECT_HEX WRITE_HEX  check page 0 holds EXPECT, write
//                                                          WRITE over page 2, report "done"
//   kvpool_arena_child heartbeat PATH                       attach, then heartbeat until killed
//   kvpool_arena_child expect-refused PATH                  exit 0 only if attaching is refused
//   kvpool_arena_child cuda-read-write PATH EXPECT WRITE [DEVICE]
//                                                          read-write on a cuda arena, mapped for
//                                                          DEVICE (default: the arena's own;
//                                                          another one reads it as a peer). CUDA
//                                                          builds.
//   kvpool_arena_child cuda-create PATH PATTERN            create a cuda arena on GPU 0, fill
//                                                          page 0 with PATTERN, serve it on an fd
//                                                          channel at PATH, exit on "exit" (as a
//                                                          kvpoold that dies). CUDA builds.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kvpool/arena/fd_channel.h"
#include "kvpool/arena/host_arena.h"
#if defined(KVP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kvpool/arena/cuda_arena.h"
#endif

namespace {

constexpr size_t kPage = 4096;

int Fail(const std::string& why) {
  std::fprintf(stderr, "kvpool_arena_child: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: kvpool_arena_child MODE PATH [...]");
  const std::string mode = argv[1], path = argv[2];
#if defined(KVP_HAVE_CUDA)
  if (mode == "cuda-create" && argc == 4) {
    const uint64_t g = kvp::CudaArena::Granularity(0).value();
    auto arena = kvp::CudaArena::Create(0, 8 * g, 16 * g, 16 * g);
    if (!arena.ok()) return Fail(arena.status().ToString());
    const uint64_t pattern = std::strtoull(argv[3], nullptr, 16);
    uint64_t page[kPage / 8];
    for (uint64_t& v : page) v = pattern;
    if (cudaMemcpy(arena->base(), page, kPage, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      return Fail("writing the cuda arena");
    }
    auto server = kvp::FdChannelServer::Listen(path, kvp::AllowList{{::getuid()}, {}});
    if (!server.ok()) return Fail(server.status().ToString());
    auto peer = server->Accept(20000);
    if (!peer.ok()) return Fail(peer.status().ToString());
    kvp::ArenaDescription d;
    d.kind = kvp::ArenaKind::kCuda;
    d.device = 0;
    d.chunk_bytes = arena->chunk_sizes();
    d.num_blocks = 1;
    auto fds = arena->ExportFds();
    if (!fds.ok()) return Fail(fds.status().ToString());
    std::vector<int> raw;
    for (const kvp::UniqueFd& fd : *fds) raw.push_back(fd.get());
    if (!peer->SendArena(d, raw).ok()) return Fail("sending the arena");
    peer->Receive(30000).IgnoreError();  // "exit"
    return 0;  // the arena, its handles and its mapping go with this process
  }
#endif
  absl::StatusOr<kvp::FdPeer> peer = kvp::ConnectFdChannel(path);
  if (!peer.ok()) return Fail(peer.status().ToString());
  auto arena = peer->ReceiveArena(5000);
  if (mode == "expect-refused") {
    return !arena.ok() && arena.status().code() == absl::StatusCode::kPermissionDenied ? 0 : 1;
  }
  if (!arena.ok()) return Fail(arena.status().ToString());
#if defined(KVP_HAVE_CUDA)
  if (mode == "cuda-read-write" && (argc == 5 || argc == 6)) {
    const int device = argc == 6 ? std::atoi(argv[5]) : arena->first.device;
    auto mapped =
        kvp::CudaArenaMapping::Map(device, arena->first.chunk_bytes, std::move(arena->second));
    if (!mapped.ok()) return Fail(mapped.status().ToString());
    const uint64_t expect = std::strtoull(argv[3], nullptr, 16);
    const uint64_t write = std::strtoull(argv[4], nullptr, 16);
    uint64_t page[kPage / 8];
    if (cudaMemcpy(page, mapped->base(), kPage, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return Fail("reading the cuda arena");
    }
    bool same = true;
    for (uint64_t v : page) same &= v == expect;
    for (uint64_t& v : page) v = write;
    if (cudaMemcpy(mapped->base() + 2 * kPage, page, kPage, cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      return Fail("writing the cuda arena");
    }
    if (!peer->Send(same ? "done" : "mismatch").ok()) return 1;
    peer->Receive(5000).IgnoreError();
    return same ? 0 : 3;
  }
#endif
  auto mapping = kvp::HostArenaMapping::Map(arena->first.chunk_bytes, std::move(arena->second));
  if (!mapping.ok()) return Fail(mapping.status().ToString());
  uint8_t* base = mapping->base();

  if (mode == "read-write" && argc == 5) {
    const uint64_t expect = std::strtoull(argv[3], nullptr, 16);
    const uint64_t write = std::strtoull(argv[4], nullptr, 16);
    bool same = true;
    for (size_t i = 0; i < kPage; i += 8) same &= std::memcmp(base + i, &expect, 8) == 0;
    for (size_t i = 0; i < kPage; i += 8) std::memcpy(base + 2 * kPage + i, &write, 8);
    if (!peer->Send(same ? "done" : "mismatch").ok()) return 1;
    peer->Receive(5000).IgnoreError();  // the parent's goodbye, or its end
    return same ? 0 : 3;
  }
  if (mode == "heartbeat") {
    while (peer->Send("H").ok()) ::usleep(5000);
    return 0;
  }
  return Fail("unknown mode " + mode);
}
