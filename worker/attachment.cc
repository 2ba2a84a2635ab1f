#include "worker/attachment.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/arena/fd_channel.h"
#include "kvpool/arena/host_arena.h"
#include "kernels/capabilities.h"
#include "kvpool/layout/block_layout.h"
#include "worker/host_executor.h"
#if KVP_HAVE_CUDA
#include "kvpool/arena/cuda_arena.h"
#include "worker/cuda_executor.h"
#endif

namespace kvp {
namespace {

constexpr int kAttachTimeoutMs = 10'000;

class HostAttachment : public Attachment {
 public:
  HostAttachment(HostArenaMapping mapping, BlockLayout layout, const JobContext& ctx)
      : mapping_(std::move(mapping)), executor_(std::move(layout), mapping_.base(), ctx) {}
  Executor& executor() override { return executor_; }
  const char* backend_name() const override { return "host"; }

 private:
  HostArenaMapping mapping_;
  HostExecutor executor_;
};

#if KVP_HAVE_CUDA
class CudaAttachment : public Attachment {
 public:
  CudaAttachment(CudaArenaMapping mapping, std::unique_ptr<CudaExecutor> executor)
      : mapping_(std::move(mapping)), executor_(std::move(executor)) {}
  ~CudaAttachment() override { executor_.reset(); }  // the stream drains before the unmap
  Executor& executor() override { return *executor_; }
  const char* backend_name() const override { return "cuda"; }

 private:
  CudaArenaMapping mapping_;
  std::unique_ptr<CudaExecutor> executor_;
};
#endif

}  // namespace

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

absl::StatusOr<std::unique_ptr<Attachment>> Attach(const std::string& path, Backend backend,
                                                   int gpu, const JobContext& ctx,
                                                   uint64_t epoch) {
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
    return std::unique_ptr<Attachment>(new HostAttachment(std::move(mapping), std::move(layout), ctx));
  }
  if (backend == Backend::kHost) {
    return absl::FailedPreconditionError(
        "kvpoold serves a cuda arena; a --backend=host worker cannot use it");
  }
#if KVP_HAVE_CUDA
  const int device = gpu >= 0 ? gpu : description.device;
  ASSIGN_OR_RETURN(CudaArenaMapping mapping,
                   CudaArenaMapping::Map(device, description.chunk_bytes, std::move(fds)));
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExecutor> executor,
                   CudaExecutor::Create(std::move(layout), mapping.base(), ctx, device));
  return std::unique_ptr<Attachment>(new CudaAttachment(std::move(mapping), std::move(executor)));
#else
  (void)gpu;
  return absl::FailedPreconditionError("kvpoold serves a cuda arena; this build has no CUDA");
#endif
}

}  // namespace kvp
