// A worker's view of kvpoold's arena: the fds fetched over the fd channel, mapped (host memory or
// GPU memory), and the executor that runs jobs on them. Dropping it unmaps everything.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kvpool/format/op_capabilities.h"
#include "protocol/kvpool.capnp.h"
#include "worker/executor.h"
#include "worker/job.h"

namespace kvp {

enum class Backend { kAuto, kCuda, kHost };

absl::StatusOr<Backend> ParseBackend(const std::string& name);

class Attachment {
 public:
  virtual ~Attachment() = default;
  virtual Executor& executor() = 0;
  virtual const char* backend_name() const = 0;
};

// Connects to the fd channel at `path`, receives the arena and maps it. ABORTED when the arena is
// not the one registration announced (`ctx`, `epoch`: kvpoold restarted; register again);
// FAILED_PRECONDITION when the backend cannot use it (a host worker and a cuda arena, or a build
// without CUDA).
absl::StatusOr<std::unique_ptr<Attachment>> Attach(const std::string& path, Backend backend,
                                                   int gpu, const JobContext& ctx,
                                                   uint64_t epoch);

// What this worker serves in `role` on a host arena and on a cuda arena (nullopt: it cannot map
// that kind: --backend says so, or a build without CUDA), from the kernels' own capability tables
// (kernels/capabilities.h), for registration.
struct WorkerServes {
  std::optional<OpCapabilities> host, cuda;
};
WorkerServes ServedFor(Backend backend, wire::Role role);

}  // namespace kvp
