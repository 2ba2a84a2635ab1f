// A worker's view of kvpoold's arena: the fds fetched over the fd channel, mapped (host memory or
// GPU memory), and the executor that runs jobs on them; for migrations into its pool, the other
// pools' arenas it pulls from, mapped on first use and kept while the attachment lasts. Dropping
// it unmaps everything.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvpool/arena/arena_description.h"
#include "kvpool/arena/unique_fd.h"

#include "absl/status/statusor.h"
#include "kvpool/format/op_capabilities.h"
#include "protocol/kvpool.capnp.h"
#include "worker/executor.h"
#include "worker/job.h"
#include "worker/migration.h"
#include "worker/paired_move.h"
#include "worker/socket_transport.h"

namespace kvp {

enum class Backend { kAuto, kCuda, kHost };

absl::StatusOr<Backend> ParseBackend(const std::string& name);

class Attachment {
 public:
  virtual ~Attachment() = default;
  virtual Executor& executor() = 0;
  virtual const char* backend_name() const = 0;

  // Copies a migration's blocks from the source pool's arena into this one; the bytes copied.
  // ABORTED when the source is not a pool of this kvpoold instance (it restarted);
  // FAILED_PRECONDITION when this worker cannot map it (a cuda arena on a GPU without peer
  // access, or another layout).
  absl::StatusOr<uint64_t> PullBlocks(const MigrateWork& work);

  // The transport of a paired move (worker/paired_move.h) of kind `transport` into or out of this
  // arena: socket for host arenas, nccl for cuda arenas (loaded on first use).
  // UNIMPLEMENTED when this worker cannot move that way (the other arena kind, or no NCCL).
  virtual absl::StatusOr<PairedTransport*> Paired(wire::Transport transport) = 0;
  // The bytes a move of `work` carries: whole blocks.
  uint64_t BytesOf(const MigrateWork& work) const {
    return static_cast<uint64_t>(work.moves.size()) * static_cast<uint64_t>(block_stride_);
  }

  // Hands this arena back to a restarted kvpoold that lacks it (docs/design.md §10): connects to
  // its return channel at `path` and sends the description it was received with and its chunk
  // fds. OK when kvpoold took it; FAILED_PRECONDITION naming why it did not; UNAVAILABLE when
  // nobody listens there.
  absl::Status HandBack(const std::string& path) const;

 protected:
  Attachment(const JobContext& ctx, uint64_t epoch, int64_t block_stride,
             ArenaDescription description)
      : ctx_(ctx), epoch_(epoch), block_stride_(block_stride),
        description_(std::move(description)) {}
  int64_t block_stride() const { return block_stride_; }
  int64_t num_blocks() const { return ctx_.num_blocks; }
  // The fds of this pool's own arena, as received.
  virtual const std::vector<UniqueFd>& chunk_fds() const = 0;

  // Another pool's arena mapped for reading by this worker's backend.
  class SourceMapping {
   public:
    virtual ~SourceMapping() = default;
    virtual const uint8_t* base() const = 0;
  };
  virtual absl::StatusOr<std::unique_ptr<SourceMapping>> MapSource(
      const ArenaDescription& description, std::vector<UniqueFd> fds) = 0;

 private:
  struct Source {
    std::unique_ptr<SourceMapping> mapping;
    int64_t num_blocks = 0;
  };
  absl::StatusOr<const Source*> SourceFor(const MigrateWork& work);

  JobContext ctx_;
  uint64_t epoch_;
  int64_t block_stride_;
  ArenaDescription description_;  // of this pool's arena
  absl::flat_hash_map<std::string, Source> sources_;  // by fd channel
};

// Connects to the fd channel at `path`, receives the arena and maps it. ABORTED when the arena is
// not the one registration announced (`ctx`, `epoch`: kvpoold restarted; register again);
// FAILED_PRECONDITION when the backend cannot use it (a host worker and a cuda arena, or a build
// without CUDA).
absl::StatusOr<std::unique_ptr<Attachment>> Attach(const std::string& path, Backend backend,
                                                   int gpu, const JobContext& ctx,
                                                   uint64_t epoch,
                                                   const SocketTransportOptions& sockets = {});

// Whether this worker can move blocks over NCCL (a cuda backend and a loadable NCCL), for
// registration.
bool CanUseNccl(Backend backend);

// What this worker serves in `role` on a host arena and on a cuda arena (nullopt: it cannot map
// that kind: --backend says so, or a build without CUDA), from the kernels' own capability tables
// (kernels/capabilities.h), for registration.
struct WorkerServes {
  std::optional<OpCapabilities> host, cuda;
};
WorkerServes ServedFor(Backend backend, wire::Role role);

// The GPUs whose memory `device` can read (peer access), for registration; empty without CUDA.
std::vector<int32_t> PeerGpusOf(int device);

}  // namespace kvp
