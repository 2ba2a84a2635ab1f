#include "daemon/http_endpoint.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace kvp {

HttpEndpoint::HttpEndpoint() : server_(std::make_unique<httplib::Server>()) {}

HttpEndpoint::~HttpEndpoint() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

absl::Status HttpEndpoint::Start(const std::string& host, int port) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    res.set_content(metrics_, "text/plain; version=0.0.4");
  });
  server_->Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    res.status = healthy_ ? 200 : 503;
    res.set_content(healthy_ ? "ok\n" : "draining\n", "text/plain");
  });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind the HTTP endpoint to ", host, ":", port));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpEndpoint::Publish(std::string metrics, bool healthy) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ = std::move(metrics);
  healthy_ = healthy;
}

}  // namespace kvp
