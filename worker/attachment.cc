#include "worker/attachment.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/arena/fd_channel.h"
#include "kvpool/arena/host_arena.h"
#include "kernels/capabilities.h"
#include "kvpool/layout/block_layout.h"
#include "protocol/transport_names.h"
#include "worker/host_executor.h"
#if KVP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kvpool/arena/cuda_arena.h"
#include "worker/cuda_executor.h"
#include "worker/nccl_transport.h"
#endif

namespace kvp {
namespace {

constexpr int kAttachTimeoutMs = 10'000;

class HostAttachment : public Attachment {
 public:
  HostAttachment(HostArenaMapping mapping, BlockLayout layout, const JobContext& ctx,
                 uint64_t epoch, ArenaDescription description,
                 const SocketTransportOptions& sockets)
      : Attachment(ctx, epoch, layout.block_stride(), std::move(description)),
        mapping_(std::move(mapping)),
        socket_(OwnArena{.base = mapping_.base(), .num_blocks = ctx.num_blocks,
                         .block_stride = layout.block_stride(), .device = -1},
                sockets),
        executor_(std::move(layout), mapping_.base(), ctx) {}
  Executor& executor() override { return executor_; }
  const char* backend_name() const override { return "host"; }
  absl::StatusOr<PairedTransport*> Paired(wire::Transport transport) override {
    if (transport != wire::Transport::SOCKET) {
      return absl::UnimplementedError(absl::StrCat(
          "a host arena moves over sockets, not ", TransportName(transport)));
    }
    return &socket_;
  }

 protected:
  const std::vector<UniqueFd>& chunk_fds() const override { return mapping_.fds(); }
  class HostSource : public SourceMapping {
   public:
    explicit HostSource(HostArenaMapping mapping) : mapping_(std::move(mapping)) {}
    const uint8_t* base() const override { return mapping_.base(); }

   private:
    HostArenaMapping mapping_;
  };
  absl::StatusOr<std::unique_ptr<SourceMapping>> MapSource(const ArenaDescription& d,
                                                           std::vector<UniqueFd> fds) override {
    if (d.kind != ArenaKind::kHost) {
      return absl::FailedPreconditionError("the source pool is not a host pool, this one is");
    }
    ASSIGN_OR_RETURN(HostArenaMapping mapping, HostArenaMapping::Map(d.chunk_bytes, std::move(fds)));
    return std::unique_ptr<SourceMapping>(new HostSource(std::move(mapping)));
  }

 private:
  HostArenaMapping mapping_;
  SocketTransport socket_;
  HostExecutor executor_;
};

#if KVP_HAVE_CUDA
class CudaAttachment : public Attachment {
 public:
  CudaAttachment(CudaArenaMapping mapping, std::unique_ptr<CudaExecutor> executor, int device,
                 const JobContext& ctx, uint64_t epoch, int64_t block_stride,
                 ArenaDescription description)
      : Attachment(ctx, epoch, block_stride, std::move(description)),
        mapping_(std::move(mapping)),
        executor_(std::move(executor)),
        device_(device) {}
  ~CudaAttachment() override {  // streams drain before the unmaps
    nccl_.reset();
    executor_.reset();
  }
  Executor& executor() override { return *executor_; }
  const char* backend_name() const override { return "cuda"; }
  absl::StatusOr<PairedTransport*> Paired(wire::Transport transport) override {
    if (transport != wire::Transport::NCCL) {
      return absl::UnimplementedError(absl::StrCat(
          "a cuda arena moves to other GPUs over NCCL, not ", TransportName(transport)));
    }
    if (nccl_ == nullptr) {
      ASSIGN_OR_RETURN(nccl_, NcclTransport::Create(OwnArena{
                                  .base = mapping_.base(), .num_blocks = num_blocks(),
                                  .block_stride = block_stride(), .device = device_}));
    }
    return nccl_.get();
  }

 protected:
  const std::vector<UniqueFd>& chunk_fds() const override { return mapping_.fds(); }
  class CudaSource : public SourceMapping {
   public:
    explicit CudaSource(CudaArenaMapping mapping) : mapping_(std::move(mapping)) {}
    const uint8_t* base() const override { return mapping_.base(); }

   private:
    CudaArenaMapping mapping_;
  };
  // Mapped for this worker's GPU: the same GPU, or a peer whose memory it can read.
  absl::StatusOr<std::unique_ptr<SourceMapping>> MapSource(const ArenaDescription& d,
                                                           std::vector<UniqueFd> fds) override {
    if (d.kind != ArenaKind::kCuda) {
      return absl::FailedPreconditionError("the source pool is not a cuda pool, this one is");
    }
    if (d.device != device_) {
      const std::vector<int32_t> peers = PeerGpusOf(device_);
      if (std::find(peers.begin(), peers.end(), d.device) == peers.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "GPU ", device_, " has no peer access to GPU ", d.device, ", the source pool's"));
      }
    }
    ASSIGN_OR_RETURN(CudaArenaMapping mapping,
                     CudaArenaMapping::Map(device_, d.chunk_bytes, std::move(fds)));
    return std::unique_ptr<SourceMapping>(new CudaSource(std::move(mapping)));
  }

 private:
  CudaArenaMapping mapping_;
  std::unique_ptr<CudaExecutor> executor_;
  std::unique_ptr<NcclTransport> nccl_;  // on the first NCCL move
  int device_;
};
#endif

}  // namespace

absl::StatusOr<const Attachment::Source*> Attachment::SourceFor(const MigrateWork& work) {
  if (auto it = sources_.find(work.source_channel); it != sources_.end()) return &it->second;
  ASSIGN_OR_RETURN(FdPeer peer, ConnectFdChannel(work.source_channel));
  ASSIGN_OR_RETURN(auto received, peer.ReceiveArena(kAttachTimeoutMs));
  auto& [description, fds] = received;
  if (description.epoch != epoch_) {
    return absl::AbortedError(absl::StrCat("pool ", work.source_pool, "'s arena is of epoch ",
                                           description.epoch, ", not this kvpoold's (", epoch_,
                                           ")"));
  }
  if (!(description.spec == ctx_.spec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", work.source_pool, " has another layout than this worker's pool"));
  }
  const uint64_t needed = static_cast<uint64_t>(description.num_blocks) * block_stride_;
  if (description.total_bytes() < needed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", work.source_pool, "'s arena of ", description.total_bytes(),
        " bytes cannot hold its ", description.num_blocks, " blocks"));
  }
  const int64_t num_blocks = description.num_blocks;
  ASSIGN_OR_RETURN(std::unique_ptr<SourceMapping> mapping,
                   MapSource(description, std::move(fds)));
  Source& source = sources_[work.source_channel];
  source.mapping = std::move(mapping);
  source.num_blocks = num_blocks;
  return &source;
}

absl::StatusOr<uint64_t> Attachment::PullBlocks(const MigrateWork& work) {
  ASSIGN_OR_RETURN(const Source* source, SourceFor(work));
  RETURN_IF_ERROR(executor().MoveBlocksFrom(source->mapping->base(), source->num_blocks,
                                            work.moves));
  return BytesOf(work);
}

std::vector<int32_t> PeerGpusOf(int device) {
  std::vector<int32_t> peers;
#if KVP_HAVE_CUDA
  int count = 0;
  if (device < 0 || cudaGetDeviceCount(&count) != cudaSuccess) return peers;
  for (int other = 0; other < count; ++other) {
    int can = 0;
    if (other != device && cudaDeviceCanAccessPeer(&can, device, other) == cudaSuccess && can) {
      peers.push_back(other);
    }
  }
#else
  (void)device;
#endif
  return peers;
}

bool CanUseNccl(Backend backend) {
#if KVP_HAVE_CUDA
  int count = 0;
  return backend != Backend::kHost && cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
         LoadNccl().ok();
#else
  (void)backend;
  return false;
#endif
}

absl::StatusOr<Backend> ParseBackend(const std::string& name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "cuda") return Backend::kCuda;
  if (name == "host") return Backend::kHost;
  return absl::InvalidArgumentError(
      absl::StrCat("backend '", name, "': expected auto, cuda or host"));
}

WorkerServes ServedFor(Backend backend, wire::Role role) {
  const auto of = [role](const BackendCapabilities& caps) {
    return role == wire::Role::PREFILL ? caps.cache_write : caps.Decode();
  };
  WorkerServes serves;
  if (backend != Backend::kCuda) serves.host = of(kHostCapabilities);
#if KVP_HAVE_CUDA
  if (backend != Backend::kHost) serves.cuda = of(kCudaCapabilities);
#endif
  return serves;
}

absl::Status Attachment::HandBack(const std::string& path) const {
  ASSIGN_OR_RETURN(FdPeer peer, ConnectFdChannel(path));
  std::vector<int> fds;
  for (const UniqueFd& fd : chunk_fds()) fds.push_back(fd.get());
  RETURN_IF_ERROR(peer.SendArena(description_, fds));
  ASSIGN_OR_RETURN(const std::string answer, peer.Receive(kAttachTimeoutMs));
  if (answer != "ok") {
    return absl::FailedPreconditionError(absl::StrCat("kvpoold did not take it: ", answer));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Attachment>> Attach(const std::string& path, Backend backend,
                                                   int gpu, const JobContext& ctx,
                                                   uint64_t epoch,
                                                   const SocketTransportOptions& sockets) {
  ASSIGN_OR_RETURN(FdPeer peer, ConnectFdChannel(path));
  ASSIGN_OR_RETURN(auto received, peer.ReceiveArena(kAttachTimeoutMs));
  auto& [description, fds] = received;
  if (description.epoch != epoch || description.num_blocks != ctx.num_blocks) {
    return absl::AbortedError(absl::StrCat(
        "the arena (epoch ", description.epoch, ", ", description.num_blocks,
        " blocks) is not the one registration announced (epoch ", epoch, ", ", ctx.num_blocks,
        " blocks); kvpoold restarted in between"));
  }
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(ctx.spec));
  if (description.kind == ArenaKind::kHost) {
    if (backend == Backend::kCuda) {
      return absl::FailedPreconditionError(
          "kvpoold serves a host arena; a --backend=cuda worker cannot use it");
    }
    ASSIGN_OR_RETURN(HostArenaMapping mapping,
                     HostArenaMapping::Map(description.chunk_bytes, std::move(fds)));
    return std::unique_ptr<Attachment>(
        new HostAttachment(std::move(mapping), std::move(layout), ctx, epoch, description,
                           sockets));
  }
  if (backend == Backend::kHost) {
    return absl::FailedPreconditionError(
        "kvpoold serves a cuda arena; a --backend=host worker cannot use it");
  }
#if KVP_HAVE_CUDA
  const int device = gpu >= 0 ? gpu : description.device;
  ASSIGN_OR_RETURN(CudaArenaMapping mapping,
                   CudaArenaMapping::Map(device, description.chunk_bytes, std::move(fds)));
  const int64_t stride = layout.block_stride();
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor,
                   CudaExecutor::Create(std::move(layout), mapping.base(), ctx, device));
  return std::unique_ptr<Attachment>(new CudaAttachment(std::move(mapping), std::move(executor),
                                                        device, ctx, epoch, stride, description));
#else
  (void)gpu;
  return absl::FailedPreconditionError("kvpoold serves a cuda arena; this build has no CUDA");
#endif
}

}  // namespace kvp
