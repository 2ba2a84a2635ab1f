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
    res.status = draining_ ? 503 : 200;
    res.set_content(draining_ ? "draining\n" : "ok\n", "text/plain");
  });
  server_->Get("/livez", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - published_)
                         .count();
    const bool live = published_.time_since_epoch().count() != 0 && age < stale_after_ms_;
    res.status = live ? 200 : 503;
    res.set_content(live ? "ok\n" : absl::StrCat("the loop has not run for ", age, " ms\n"),
                    "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    res.status = not_ready_.empty() ? 200 : 503;
    res.set_content(not_ready_.empty() ? "ready\n" : not_ready_ + "\n", "text/plain");
  });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind the HTTP endpoint to ", host, ":", port));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpEndpoint::Publish(std::string metrics, bool draining, std::string not_ready) {
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ = std::move(metrics);
  draining_ = draining;
  not_ready_ = std::move(not_ready);
  published_ = std::chrono::steady_clock::now();
}

}  // namespace kvp
