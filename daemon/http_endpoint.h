// kvpoold's HTTP endpoint (docs/design.md §9): GET /metrics (Prometheus text) and GET /healthz (200
// while serving, 503 while draining). It runs on its own thread and serves the copy the daemon's
// loop last published, so it never touches the broker.
#pragma once

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

  // What the next requests see.
  void Publish(std::string metrics, bool healthy);

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::string metrics_;
  bool healthy_ = false;
};

}  // namespace kvp
