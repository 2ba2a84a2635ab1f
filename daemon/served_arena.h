// The arena kvpoold owns and hands to workers: a host arena (memfd chunks) or a cuda arena
// (cuMemCreate chunks on one GPU). The daemon never touches block bytes; it only describes the
// arena and passes its file descriptors over the fd channel.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/arena/arena_description.h"
#include "kvpool/arena/fd_channel.h"

namespace kvp {

// The chunk size of host (memfd) arenas; a cuda arena's follows its GPU's granularity.
inline constexpr uint64_t kHostChunkBytes = uint64_t{64} << 20;

class ServedArena {
 public:
  virtual ~ServedArena() = default;
  virtual ArenaKind kind() const = 0;
  virtual int32_t device() const = 0;  // -1 for the host arena
  virtual std::vector<uint64_t> chunk_sizes() const = 0;
  // Sends `description` (filled in with this arena's kind, device and chunks) and the chunk fds.
  virtual absl::Status SendTo(FdPeer& peer, ArenaDescription description) const = 0;
  // A new fd per chunk (for systemd's fd store: what keeps the memory across a restart).
  virtual absl::StatusOr<std::vector<UniqueFd>> ChunkFds() const = 0;
};

absl::StatusOr<std::unique_ptr<ServedArena>> CreateHostServedArena(uint64_t bytes);
// UNIMPLEMENTED in builds without CUDA; UNAVAILABLE when there is no usable GPU `device`.
absl::StatusOr<std::unique_ptr<ServedArena>> CreateCudaServedArena(int device, uint64_t bytes);
// An arena from before a restart: its chunk fds, `chunk_bytes` each (HostArena::Adopt,
// CudaArena::Adopt); `device` -1 is a host arena.
absl::StatusOr<std::unique_ptr<ServedArena>> AdoptServedArena(int device, uint64_t chunk_bytes,
                                                              std::vector<UniqueFd> fds);

}  // namespace kvp
