// Real kvpoold and kvpool-worker processes for integration tests: a private runtime directory,
// the host backend, short heartbeats so failures show within a second, and teardown that never
// leaves a process behind.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "tests/integration/fake_fd_store.h"

namespace kvp::testing {

// A TCP port on the loopback interface that nothing listens on right now; -1 if none was found.
int FreePort();

struct ServiceOptions {
  std::string backend = "host";           // of kvpoold's arena and the workers
  std::vector<std::string> daemon_flags;  // added to the defaults below (later flags win)
  int prefill_workers = 1;
  int decode_workers = 1;
  // The --pool of each worker, in order (kvpoold --pools); shorter or empty: no --pool given.
  std::vector<int> prefill_pools, decode_pools;
  std::vector<std::string> worker_flags;  // added to every worker's
  // kvpoold keeps its state in <runtime dir>/state and its chunks in a fake systemd fd store
  // (fake_fd_store.h), passed back to it by RestartDaemon: the cache survives restarts.
  bool keep_state = false;
  bool fd_store = true;  // false: state kept, but no fd store (as on Kubernetes)
};

// Two pools, a prefill worker on pool 0 and a decode worker on each (the set-up of the migration
// and restart tests): --pools=2 on the host backend, --gpus=0,0 (two pools on GPU 0) on cuda.
ServiceOptions TwoPoolOptions(const std::string& backend = "host");

// Random K/V (and index K) for `tokens` tokens of the pool's shape: a client's own tensors.
TokenActivations RandomActivations(const PoolSpec& spec, size_t tokens, uint64_t seed);

class ServiceProcesses {
 public:
  // Starts kvpoold (--arena_mib=64 --layers=2 --topk=64 --heartbeat_ms=100
  // --lease_expiry_ms=600, no HTTP) and the workers, and waits until all have registered.
  static absl::StatusOr<std::unique_ptr<ServiceProcesses>> Start(const ServiceOptions& options);
  ~ServiceProcesses();  // SIGKILLs whatever is still running, removes the runtime directory

  const std::string& runtime_dir() const { return dir_; }
  std::string endpoint() const;
  ClientOptions client_options(const std::string& name) const;

  pid_t daemon() const { return daemon_; }
  const std::vector<pid_t>& prefill_workers() const { return prefill_; }
  const std::vector<pid_t>& decode_workers() const { return decode_; }

  // Starts one more worker of `role` ("prefill" or "decode") for `pool` (-1: no --pool), with
  // the options' worker flags and `flags`; it is listed with its role's workers.
  pid_t StartWorker(const std::string& role, int pool, std::vector<std::string> flags = {});
  // False once kvpoold has exited (it is reaped then).
  bool DaemonRunning();
  // Sends `signal` to a process and waits for it; its exit status (or 128 + signal).
  int Stop(pid_t pid, int signal);
  // Starts kvpoold again on the same runtime directory (after Stop), with `extra_flags` added to
  // this start's (not later ones'), and the fd store's fds when the state is kept.
  absl::Status RestartDaemon(const std::vector<std::string>& extra_flags = {});
  FakeFdStore* fd_store() { return fd_store_.get(); }
  // Waits until kvpoold reports `workers` registered workers.
  absl::Status WaitForWorkers(uint32_t workers, int timeout_ms);

  // Runs kvpoold with `flags` in a fresh runtime directory until it exits by itself (bad flags);
  // its exit status. DEADLINE_EXCEEDED (after killing it) if it still runs after timeout_ms.
  static absl::StatusOr<int> RunDaemonToExit(std::vector<std::string> flags, int timeout_ms);

 private:
  ServiceProcesses() = default;
  // An instance with a fresh runtime directory and no processes yet.
  static absl::StatusOr<std::unique_ptr<ServiceProcesses>> WithRuntimeDir();
  pid_t Spawn(const std::string& binary, std::vector<std::string> args);

  std::string dir_;
  std::string backend_;
  std::vector<std::string> daemon_flags_, worker_flags_;
  pid_t daemon_ = -1;
  std::vector<pid_t> prefill_, decode_;
  std::unique_ptr<FakeFdStore> fd_store_;
};

}  // namespace kvp::testing
