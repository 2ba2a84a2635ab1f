#include "tests/integration/service_processes.h"

#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "protocol/endpoints.h"
#include "tests/testing/test_data.h"

extern char** environ;

namespace kvp::testing {
namespace {

// The binaries: $KVPOOLD_BIN / $KVPOOL_WORKER_BIN (a bundle on a GPU host), else the build's.
std::string Binary(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v != nullptr && v[0] != '\0' ? v : built;
}

std::string Kvpoold() { return Binary("KVPOOLD_BIN", KVPOOLD_PATH); }
std::string KvpoolWorker() { return Binary("KVPOOL_WORKER_BIN", KVPOOL_WORKER_PATH); }

}  // namespace

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool found = fd >= 0 &&
                     ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) ::close(fd);
  return found ? ntohs(addr.sin_port) : -1;
}

TokenActivations RandomActivations(const PoolSpec& spec, size_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t row = size_t(spec.num_kv_heads) * spec.head_dim;
  TokenActivations a;
  for (int l = 0; l < spec.num_layers; ++l) {
    a.k.push_back(RandomBf16(rng, tokens * row));
    a.v.push_back(RandomBf16(rng, tokens * row));
    if (spec.indexer) a.index_k.push_back(RandomBf16(rng, tokens * 128));
  }
  return a;
}

ServiceOptions TwoPoolOptions(const std::string& backend) {
  ServiceOptions options;
  options.backend = backend;
  options.daemon_flags = {backend == "cuda" ? "--gpus=0,0" : "--pools=2"};
  options.prefill_workers = 1;
  options.prefill_pools = {0};
  options.decode_workers = 2;
  options.decode_pools = {0, 1};
  return options;
}

absl::StatusOr<std::unique_ptr<ServiceProcesses>> ServiceProcesses::WithRuntimeDir() {
  std::unique_ptr<ServiceProcesses> s(new ServiceProcesses());
  char dir_template[] = "/tmp/kvpool-test-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
  s->dir_ = dir_template;
  return s;
}

absl::StatusOr<std::unique_ptr<ServiceProcesses>> ServiceProcesses::Start(
    const ServiceOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<ServiceProcesses> s, WithRuntimeDir());
  s->daemon_flags_ = {absl::StrCat("--backend=", options.backend), "--arena_mib=64",        "--layers=2",
                      "--topk=64",           "--heartbeat_ms=100",    "--lease_expiry_ms=600",
                      "--metrics_port=-1",   "--drain_timeout_ms=20000"};
  s->daemon_flags_.insert(s->daemon_flags_.end(), options.daemon_flags.begin(),
                          options.daemon_flags.end());
  if (options.keep_state) {
    if (options.fd_store) {
      ASSIGN_OR_RETURN(s->fd_store_, FakeFdStore::Listen(absl::StrCat(s->dir_, "/notify.sock")));
    }
    s->daemon_flags_.push_back(absl::StrCat("--state_dir=", s->dir_, "/state"));
  }
  RETURN_IF_ERROR(s->RestartDaemon());
  s->backend_ = options.backend;
  s->worker_flags_ = options.worker_flags;
  const auto pool_of = [](const std::vector<int>& pools, int i) {
    return i < static_cast<int>(pools.size()) ? pools[i] : -1;
  };
  for (int i = 0; i < options.prefill_workers; ++i) {
    s->StartWorker("prefill", pool_of(options.prefill_pools, i));
  }
  for (int i = 0; i < options.decode_workers; ++i) {
    s->StartWorker("decode", pool_of(options.decode_pools, i));
  }
  RETURN_IF_ERROR(
      s->WaitForWorkers(static_cast<uint32_t>(options.prefill_workers + options.decode_workers),
                        20'000));
  return s;
}

ServiceProcesses::~ServiceProcesses() {
  std::vector<pid_t> all = prefill_;
  all.insert(all.end(), decode_.begin(), decode_.end());
  all.push_back(daemon_);
  for (pid_t p : all) {
    if (p > 0) Stop(p, SIGKILL);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string ServiceProcesses::endpoint() const { return EndpointIn(dir_); }

ClientOptions ServiceProcesses::client_options(const std::string& name) const {
  ClientOptions o;
  o.endpoint = endpoint();
  o.name = name;
  o.timeout_ms = 30'000;
  return o;
}

pid_t ServiceProcesses::StartWorker(const std::string& role, int pool,
                                    std::vector<std::string> flags) {
  std::vector<std::string> args = {absl::StrCat("--role=", role),
                                   absl::StrCat("--backend=", backend_),
                                   absl::StrCat("--runtime_dir=", dir_)};
  if (pool >= 0) args.push_back(absl::StrCat("--pool=", pool));
  args.insert(args.end(), worker_flags_.begin(), worker_flags_.end());
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = Spawn(KvpoolWorker(), std::move(args));
  (role == "prefill" ? prefill_ : decode_).push_back(pid);
  return pid;
}

pid_t ServiceProcesses::Spawn(const std::string& binary, std::vector<std::string> args) {
  args.insert(args.begin(), binary);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, binary.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

bool ServiceProcesses::DaemonRunning() {
  if (daemon_ <= 0) return false;
  int status = 0;
  if (::waitpid(daemon_, &status, WNOHANG) != daemon_) return true;
  daemon_ = -1;
  return false;
}

int ServiceProcesses::Stop(pid_t pid, int signal) {
  if (pid <= 0) return -1;
  ::kill(pid, signal);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  auto forget = [pid](std::vector<pid_t>& v) { std::erase(v, pid); };
  forget(prefill_);
  forget(decode_);
  if (pid == daemon_) daemon_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

absl::Status ServiceProcesses::RestartDaemon(const std::vector<std::string>& extra_flags) {
  std::vector<std::string> args = daemon_flags_;
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  args.push_back(absl::StrCat("--runtime_dir=", dir_));
  if (fd_store_ == nullptr) {
    daemon_ = Spawn(Kvpoold(), args);
  } else {
    // As systemd passes them: fds 3.. named by LISTEN_FDNAMES, LISTEN_PID the daemon's own (a
    // shell that execs keeps its pid).
    fd_store_->Drain();
    const std::vector<int> fds = fd_store_->fds();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    for (size_t i = 0; i < fds.size(); ++i) {
      posix_spawn_file_actions_adddup2(&actions, fds[i], static_cast<int>(3 + i));
    }
    std::string command = absl::StrCat("NOTIFY_SOCKET='", fd_store_->socket_path(), "' ");
    if (!fds.empty()) {
      absl::StrAppend(&command, "LISTEN_PID=$$ LISTEN_FDS=", fds.size(), " LISTEN_FDNAMES='",
                      fd_store_->joined_names(), "' ");
    }
    absl::StrAppend(&command, "exec '", Kvpoold(), "'");
    for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
    std::vector<std::string> argv_storage = {"/bin/sh", "-c", command};
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int r = ::posix_spawn(&pid, "/bin/sh", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    daemon_ = r == 0 ? pid : -1;
  }
  if (daemon_ < 0) return absl::InternalError("cannot start kvpoold");
  return absl::OkStatus();
}

absl::StatusOr<int> ServiceProcesses::RunDaemonToExit(std::vector<std::string> flags,
                                                      int timeout_ms) {
  ASSIGN_OR_RETURN(std::unique_ptr<ServiceProcesses> s, WithRuntimeDir());
  flags.push_back(absl::StrCat("--runtime_dir=", s->dir_));
  s->daemon_ = s->Spawn(Kvpoold(), flags);
  if (s->daemon_ < 0) return absl::InternalError("cannot start kvpoold");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(s->daemon_, &status, WNOHANG) == s->daemon_) {
      s->daemon_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("kvpoold is still running");  // the destructor kills it
}

absl::Status ServiceProcesses::WaitForWorkers(uint32_t workers, int timeout_ms) {
  ClientOptions o = client_options("harness");
  o.timeout_ms = 500;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  absl::Status last = absl::UnavailableError("never answered");
  while (std::chrono::steady_clock::now() < deadline) {
    if (daemon_ > 0 && !DaemonRunning()) return absl::UnavailableError("kvpoold exited");
    Client client(o);  // a fresh socket per try: no stale replies
    absl::StatusOr<PoolHealth> h = client.Health();
    if (h.ok() && h->workers == workers) return absl::OkStatus();
    last = h.ok() ? absl::UnavailableError(absl::StrCat(h->workers, " workers")) : h.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("waiting for ", workers, " workers: ", last.ToString()));
}

}  // namespace kvp::testing
