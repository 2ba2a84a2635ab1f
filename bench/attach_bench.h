// kvpool-bench attach: how long another process takes to attach a cuda arena (receive the fds,
// import and map every chunk, grant access), measured in that process. CUDA builds, on a GPU.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct AttachResult {
  double arena_gib = 0;
  double chunk_gib = 0;
  int chunks = 0;
  double create_ms = 0;  // kvpoold side: cuMemCreate + map of every chunk
  double attach_ms = 0;  // attaching side: import + map + access of every chunk
  double connect_to_mapped_ms = 0;
  double context_ms = 0;  // the attaching process's CUDA context creation, done before and apart
};

// `self` is this binary's path; it is started again as "attach-child PATH".
absl::StatusOr<AttachResult> RunAttachBench(const std::string& self, double arena_gib,
                                            double chunk_gib);
// The child half: attaches over the fd channel at `path` and reports its timings.
int AttachChild(const std::string& path);

std::string AttachTable(const AttachResult& r);
std::string AttachJson(const AttachResult& r, const std::string& date, const std::string& device);

}  // namespace kvp::bench
