#include "protocol/dealer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

std::string NewMonitorAddress() {
  static std::atomic<uint64_t> next{0};
  return absl::StrCat("inproc://kvp-dealer-monitor-", next.fetch_add(1));
}

int64_t MillisLeft(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                               std::chrono::steady_clock::now())
      .count();
}

}  // namespace

Dealer::Dealer(zmq::context_t& context, const std::string& endpoint, const std::string& identity,
               const CurveClientKeys* curve)
    : socket_(context, zmq::socket_type::dealer), monitor_(context, zmq::socket_type::pair) {
  if (!identity.empty()) socket_.set(zmq::sockopt::routing_id, identity);
  if (curve != nullptr) UseCurveClientKeys(socket_, *curve);
  curve_ = curve != nullptr;
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::sndtimeo, 5000);
  const std::string monitor_address = NewMonitorAddress();
  if (zmq_socket_monitor(socket_.handle(), monitor_address.c_str(), ZMQ_EVENT_DISCONNECTED) == 0) {
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor_address);
  }
  socket_.connect(endpoint);
}

Dealer::~Dealer() {
  // The monitor stops before either socket closes: an event the closing socket sent to a monitor
  // whose reader had gone would never be freed (libzmq; LeakSanitizer saw it).
  zmq_socket_monitor(socket_.handle(), nullptr, 0);
  DropStaleEvents();
}

absl::Status Dealer::Send(const EnvelopeBuilder& message) {
  message.set_epoch(epoch_);
  std::vector<zmq::message_t> frames = message.Frame();
  try {
    if (!zmq::send_multipart(socket_, frames)) {
      // A refused CURVE handshake looks the same from here: no connection to send on.
      return absl::UnavailableError(absl::StrCat(
          "kvpoold is not accepting messages (send timed out)",
          curve_ ? "; over CURVE, check that kvpoold lists this client's public key and that "
                   "the server key is kvpoold's"
                 : ""));
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("sending to kvpoold: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Dealer::Receive(int timeout_ms) {
  if (keep_alive_ms_ <= 0) return ReceiveOnce(timeout_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const int64_t left = MillisLeft(deadline);
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no message from kvpoold within ", timeout_ms, " ms"));
    }
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> message =
        ReceiveOnce(static_cast<int>(std::min<int64_t>(left, keep_alive_ms_)));
    if (absl::IsDeadlineExceeded(message.status())) {
      EnvelopeBuilder beat(0);  // id 0: its reply is recognised and dropped below
      beat.envelope().getBody().initHeartbeat().setLease(0);
      if (absl::Status s = Send(beat); !s.ok()) return s;
      continue;
    }
    if (message.ok() && (*message)->request_id() == 0 &&
        (*message)->envelope().getBody().isHeartbeatReply()) {
      const uint64_t epoch = (*message)->envelope().getEpoch();
      if (epoch != 0 && epoch_ != 0 && epoch != epoch_) {
        const uint64_t before = epoch_;
        epoch_ = epoch;
        return absl::UnavailableError(absl::StrCat(
            "kvpoold restarted (epoch ", before, " -> ", epoch,
            ") while a reply was awaited: requests sent before the restart were lost"));
      }
      continue;
    }
    return message;
  }
}

void Dealer::DropStaleEvents() {
  if (!monitor_.handle()) return;
  std::vector<zmq::message_t> event;
  while (zmq::recv_multipart(monitor_, std::back_inserter(event), zmq::recv_flags::dontwait)) {
    event.clear();
  }
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Dealer::ReceiveOnce(int timeout_ms) {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 2, std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    // EINTR: a signal (SIGTERM asking the process to stop) arrived while waiting.
    return e.num() == EINTR ? absl::CancelledError("interrupted by a signal")
                            : absl::UnavailableError(absl::StrCat("waiting: ", e.what()));
  }
  std::vector<zmq::message_t> frames;
  if (items[0].revents & ZMQ_POLLIN) {
    try {
      (void)zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat("receiving: ", e.what()));
    }
  }
  if (frames.empty()) {
    if (items[1].revents & ZMQ_POLLIN) {
      DropStaleEvents();
      reconnecting_ = true;  // whoever answers next may be a new kvpoold
      return absl::UnavailableError(
          "lost the connection to kvpoold (it stopped or restarted) while waiting: requests in "
          "flight may not have run; retry them once it is back");
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no message from kvpoold within ", timeout_ms, " ms"));
  }
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> parsed =
      ParseEnvelope(std::move(frames), limits_);
  if (parsed.ok()) {
    const uint64_t epoch = (*parsed)->envelope().getEpoch();
    if (epoch != 0 && (epoch_ == 0 || reconnecting_)) {
      epoch_ = epoch;
      reconnecting_ = false;
    }
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Dealer::Call(const EnvelopeBuilder& message,
                                                             int timeout_ms) {
  const uint64_t id = message.request_id();
  DropStaleEvents();
  const uint64_t sent_to = reconnecting_ ? 0 : epoch_;  // 0: to whichever kvpoold is there
  if (absl::Status s = Send(message); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const int64_t left = MillisLeft(deadline);
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no reply from kvpoold within ", timeout_ms, " ms"));
    }
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = Receive(static_cast<int>(left));
    if (!reply.ok()) return reply;
    const uint64_t epoch = (*reply)->envelope().getEpoch();
    if ((*reply)->request_id() != id) {
      // Another kvpoold answering something else: the one this request went to is gone.
      if (sent_to != 0 && epoch != 0 && epoch != sent_to) {
        epoch_ = epoch;
        return absl::UnavailableError(absl::StrCat(
            "kvpoold restarted (epoch ", sent_to, " -> ", epoch, ") before answering request ",
            id, "; it was lost: retry it"));
      }
      continue;
    }
    if (epoch != 0) epoch_ = epoch;
    const auto body = (*reply)->envelope().getBody();
    if (body.isError()) return StatusFromWire(body.getError());
    return reply;
  }
}

}  // namespace kvp
