#include "protocol/dealer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "protocol/status_codec.h"

namespace kvp {

Dealer::Dealer(zmq::context_t& context, const std::string& endpoint, const std::string& identity,
               const CurveClientKeys* curve)
    : socket_(context, zmq::socket_type::dealer) {
  if (!identity.empty()) socket_.set(zmq::sockopt::routing_id, identity);
  if (curve != nullptr) UseCurveClientKeys(socket_, *curve);
  curve_ = curve != nullptr;
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::sndtimeo, 5000);
  socket_.connect(endpoint);
}

absl::Status Dealer::Send(const EnvelopeBuilder& message) {
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
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count();
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
      continue;
    }
    return message;
  }
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Dealer::ReceiveOnce(int timeout_ms) {
  // A blocking receive with a timeout: one wake-up per message, no separate poll.
  socket_.set(zmq::sockopt::rcvtimeo, timeout_ms);
  std::vector<zmq::message_t> frames;
  try {
    if (!zmq::recv_multipart(socket_, std::back_inserter(frames))) {
      return absl::DeadlineExceededError(
          absl::StrCat("no message from kvpoold within ", timeout_ms, " ms"));
    }
  } catch (const zmq::error_t& e) {
    // EINTR: a signal (SIGTERM asking the process to stop) arrived while waiting.
    return e.num() == EINTR ? absl::CancelledError("interrupted by a signal")
                            : absl::UnavailableError(absl::StrCat("receiving: ", e.what()));
  }
  return ParseEnvelope(std::move(frames));
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Dealer::Call(const EnvelopeBuilder& message,
                                                             int timeout_ms) {
  const uint64_t id = message.request_id();
  if (absl::Status s = Send(message); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no reply from kvpoold within ", timeout_ms, " ms"));
    }
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> reply = Receive(static_cast<int>(left));
    if (!reply.ok()) return reply;
    if ((*reply)->request_id() != id) continue;
    const auto body = (*reply)->envelope().getBody();
    if (body.isError()) return StatusFromWire(body.getError());
    return reply;
  }
}

}  // namespace kvp
