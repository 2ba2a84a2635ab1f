// kvpoold's HTTP endpoint (docs/design.md §9), on its own thread, serving what the daemon's loop
// last published (it never touches the broker):
//   GET /metrics  Prometheus text;
//   GET /livez    200 while the loop publishes (every tick), 503 once it has not for `stale_after`:
//                 a liveness probe (a stuck loop is restarted, a busy one is not);
//   GET /readyz   200 when kvpoold serves: not draining, every pool mapped with a prefill and a
//                 decode worker; 503 naming what is missing: a readiness probe;
//   GET /healthz  200 unless draining (kept for earlier deployments).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace kvp {

class HttpEndpoint {
 public:
  HttpEndpoint();
  ~HttpEndpoint();  // stops the server and joins its thread

  // Binds host:port (port 0: any free port; see port()) and starts serving.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }

  // What the next requests see. `not_ready`: why kvpoold does not serve yet (empty: it does).
  void Publish(std::string metrics, bool draining, std::string not_ready);
  void set_stale_after_ms(int64_t ms) { stale_after_ms_ = ms; }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::string metrics_;
  bool draining_ = true;
  std::string not_ready_ = "starting";
  std::chrono::steady_clock::time_point published_{};
  int64_t stale_after_ms_ = 10000;
};

}  // namespace kvp
