// A worker's view of kvpoold's arena: the fds fetched over the fd channel, mapped (host memory or
// GPU memory), and the executor that runs jobs on them. Dropping it unmaps everything.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
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

// The formats and head dimensions this build's kernels serve, for registration.
std::vector<KvFormat> SupportedFormats();
std::vector<int> SupportedHeadDims();
bool CudaBuild();

}  // namespace kvp
