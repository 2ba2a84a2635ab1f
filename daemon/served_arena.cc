#include "daemon/served_arena.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/arena/host_arena.h"
#if KVP_HAVE_CUDA
#include "kvpool/arena/cuda_arena.h"
#endif

namespace kvp {
namespace {

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

class HostServedArena : public ServedArena {
 public:
  explicit HostServedArena(HostArena arena) : arena_(std::move(arena)) {}
  ArenaKind kind() const override { return ArenaKind::kHost; }
  int32_t device() const override { return -1; }
  std::vector<uint64_t> chunk_sizes() const override { return arena_.chunk_sizes(); }
  absl::Status SendTo(FdPeer& peer, ArenaDescription d) const override {
    d.kind = kind();
    d.device = device();
    d.chunk_bytes = chunk_sizes();
    const std::vector<int> fds = arena_.fds();
    return peer.SendArena(d, fds);
  }
  absl::StatusOr<std::vector<UniqueFd>> ChunkFds() const override {
    std::vector<UniqueFd> out;
    for (int fd : arena_.fds()) {
      UniqueFd dup = UniqueFd::Duplicate(fd);
      if (!dup.valid()) return absl::InternalError("cannot duplicate a host arena chunk fd");
      out.push_back(std::move(dup));
    }
    return out;
  }

 private:
  HostArena arena_;
};

#if KVP_HAVE_CUDA
class CudaServedArena : public ServedArena {
 public:
  explicit CudaServedArena(CudaArena arena) : arena_(std::move(arena)) {}
  ArenaKind kind() const override { return ArenaKind::kCuda; }
  int32_t device() const override { return arena_.device(); }
  std::vector<uint64_t> chunk_sizes() const override { return arena_.chunk_sizes(); }
  absl::Status SendTo(FdPeer& peer, ArenaDescription d) const override {
    d.kind = kind();
    d.device = device();
    d.chunk_bytes = chunk_sizes();
    ASSIGN_OR_RETURN(std::vector<UniqueFd> owned, arena_.ExportFds());
    std::vector<int> fds;
    for (const UniqueFd& fd : owned) fds.push_back(fd.get());
    return peer.SendArena(d, fds);  // the fds close when `owned` goes
  }
  absl::StatusOr<std::vector<UniqueFd>> ChunkFds() const override { return arena_.ExportFds(); }

 private:
  CudaArena arena_;
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<ServedArena>> CreateHostServedArena(uint64_t bytes) {
  const uint64_t rounded = RoundUp(bytes, kHostChunkBytes);
  ASSIGN_OR_RETURN(HostArena arena, HostArena::Create(kHostChunkBytes, rounded, rounded));
  return std::unique_ptr<ServedArena>(new HostServedArena(std::move(arena)));
}

absl::StatusOr<std::unique_ptr<ServedArena>> AdoptServedArena(int device, uint64_t chunk_bytes,
                                                              std::vector<UniqueFd> fds) {
  if (device < 0) {
    ASSIGN_OR_RETURN(HostArena arena, HostArena::Adopt(chunk_bytes, std::move(fds)));
    return std::unique_ptr<ServedArena>(new HostServedArena(std::move(arena)));
  }
#if KVP_HAVE_CUDA
  ASSIGN_OR_RETURN(CudaArena arena, CudaArena::Adopt(device, chunk_bytes, std::move(fds)));
  return std::unique_ptr<ServedArena>(new CudaServedArena(std::move(arena)));
#else
  return absl::UnimplementedError("this kvpoold was built without CUDA; it cannot adopt GPU chunks");
#endif
}

absl::StatusOr<std::unique_ptr<ServedArena>> CreateCudaServedArena(int device, uint64_t bytes) {
#if KVP_HAVE_CUDA
  ASSIGN_OR_RETURN(uint64_t granularity, CudaArena::Granularity(device));
  const uint64_t chunk = RoundUp(std::min(bytes, kDefaultCudaChunkBytes), granularity);
  const uint64_t rounded = RoundUp(bytes, chunk);
  ASSIGN_OR_RETURN(CudaArena arena, CudaArena::Create(device, chunk, rounded, rounded));
  return std::unique_ptr<ServedArena>(new CudaServedArena(std::move(arena)));
#else
  (void)device;
  (void)bytes;
  return absl::UnimplementedError("this kvpoold was built without CUDA; use --backend=host");
#endif
}

}  // namespace kvp
