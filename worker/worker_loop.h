// kvpool-worker's life (docs/design.md §6, §7): register with kvpoold, attach its arena, execute
// jobs and heartbeat; when kvpoold stops answering (or says the lease is gone) drop the arena and
// register again once it is back. Heartbeats run on their own thread and socket, so a long job does
// not look like a dead worker.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "protocol/kvpool.capnp.h"
#include "worker/attachment.h"

namespace kvp {

struct WorkerOptions {
  std::string endpoint;
  wire::Role role = wire::Role::DECODE;
  int gpu = -1;   // -1: the arena's own GPU
  int pool = -1;  // the pool it serves; -1: the one on its gpu, or pool 0
  Backend backend = Backend::kAuto;
  int register_timeout_ms = 1000;
  SocketTransportOptions sockets;  // socket moves of host pools (worker/socket_transport.h)
};

class WorkerLoop {
 public:
  explicit WorkerLoop(WorkerOptions options) : options_(std::move(options)) {}

  // Runs until `stop` is set (OK) or registration is refused for good (the worker cannot serve
  // this pool: UNIMPLEMENTED, FAILED_PRECONDITION).
  absl::Status Run(const std::atomic<bool>& stop);

 private:
  WorkerOptions options_;
};

}  // namespace kvp
