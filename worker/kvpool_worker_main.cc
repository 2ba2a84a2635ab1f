// kvpool-worker: executes prefill or decode jobs for one of kvpoold's pools on one GPU (or the
// host backend), and the migrations into that pool.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "base/flag_file.h"
#include "base/journal_sink.h"
#include "base/malloc_tuning.h"
#include "protocol/endpoints.h"
#include "worker/worker_loop.h"

ABSL_FLAG(std::string, role, "decode", "prefill or decode");
ABSL_FLAG(int, gpu, -1, "GPU to run on; -1: the arena's GPU");
ABSL_FLAG(int, pool, -1,
          "kvpoold pool to serve (kvpoold --pools, --gpus); -1: the pool on --gpu, or pool 0");
ABSL_FLAG(std::string, backend, "auto", "auto (follow kvpoold's arena), cuda or host");
ABSL_FLAG(std::string, runtime_dir, "", "kvpoold's runtime directory (see kvpoold --help)");
ABSL_FLAG(std::string, endpoint, "", "kvpoold's endpoint; default ipc://<runtime_dir>/kvpoold.sock");
ABSL_FLAG(std::string, transfer_address, "127.0.0.1",
          "numeric IPv4 or IPv6 address this worker receives socket moves on (host pools; the "
          "address other nodes' workers reach it by)");
ABSL_FLAG(double, transfer_max_mib_per_s, 0,
          "the most MiB a second this worker sends over socket moves; 0: no limit");

namespace {

std::atomic<bool> g_stop = false;

void OnSignal(int) { g_stop = true; }

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvpool-worker: runs kvpoold's prefill or decode jobs.\n"
      "Example: kvpool-worker --role=decode --gpu=0");
  kvp::KeepFreedMemoryForReuse();
  std::vector<std::string> storage;
  if (auto args = kvp::ParseCommandLineWithFlagFiles(argc, argv, storage); !args.ok()) {
    std::fprintf(stderr, "kvpool-worker: %s\n", args.status().ToString().c_str());
    return 2;
  }
  kvp::InstallLogger("kvpool-worker");
  kvp::WorkerOptions options;
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "prefill" && role != "decode") {
    spdlog::error("--role={}: expected prefill or decode", role);
    return 2;
  }
  options.role = role == "prefill" ? kvp::wire::Role::PREFILL : kvp::wire::Role::DECODE;
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.pool = absl::GetFlag(FLAGS_pool);
  absl::StatusOr<kvp::Backend> backend = kvp::ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    spdlog::error("{}", backend.status().ToString());
    return 2;
  }
  options.backend = *backend;
  options.sockets.listen_address = absl::GetFlag(FLAGS_transfer_address);
  const double pace = absl::GetFlag(FLAGS_transfer_max_mib_per_s);
  if (pace < 0) {
    spdlog::error("--transfer_max_mib_per_s={}: expected 0 (no limit) or more", pace);
    return 2;
  }
  options.sockets.max_bytes_per_second = static_cast<uint64_t>(pace * (1 << 20));
  std::string runtime_dir = absl::GetFlag(FLAGS_runtime_dir);
  if (runtime_dir.empty()) runtime_dir = kvp::DefaultRuntimeDir();
  options.endpoint = absl::GetFlag(FLAGS_endpoint);
  if (options.endpoint.empty()) options.endpoint = kvp::EndpointIn(runtime_dir);

  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  const absl::Status status = kvp::WorkerLoop(options).Run(g_stop);
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  spdlog::info("stopped");
  return 0;
}
