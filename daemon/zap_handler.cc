#include "daemon/zap_handler.h"

#include <spdlog/spdlog.h>

#include <iterator>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

// A key's first bytes in hex: enough to tell keys apart in a log, not the key.
std::string KeyPrefix(const std::string& raw) {
  std::string hex;
  for (size_t i = 0; i < 4 && i < raw.size(); ++i) {
    absl::StrAppend(&hex, absl::Hex(static_cast<uint8_t>(raw[i]), absl::kZeroPad2));
  }
  return hex + "...";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Bind(
    zmq::context_t& context, const std::vector<std::string>& allowed,
    const absl::flat_hash_map<std::string, std::string>& peers) {
  absl::flat_hash_map<std::string, std::string> users;
  for (const std::string& key : allowed) users.emplace(key, "");
  for (const auto& [key, name] : peers) {
    if (!users.emplace(key, absl::StrCat(kZapPeerUserPrefix, name)).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the CURVE key of peer ", name, " is also a client's (", KeyPrefix(key),
          "): one key, one role"));
    }
  }
  zmq::socket_t socket(context, zmq::socket_type::rep);
  socket.set(zmq::sockopt::linger, 0);
  try {
    socket.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("cannot bind the ZAP handler: ", e.what()));
  }
  return std::unique_ptr<ZapHandler>(new ZapHandler(std::move(socket), std::move(users)));
}

void ZapHandler::AnswerOne() {
  // Request: version, request id, domain, address, routing id, mechanism, credentials...
  std::vector<zmq::message_t> request;
  if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) {
    return;
  }
  const auto frame = [&](size_t i) {
    return i < request.size() ? request[i].to_string() : std::string();
  };
  const std::string address = frame(3), mechanism = frame(5), key = frame(6);
  const auto user = users_.find(key);
  const bool admitted =
      request.size() == 7 && frame(0) == "1.0" && mechanism == "CURVE" && user != users_.end();
  if (admitted) {
    spdlog::info("tcp {} {} admitted (CURVE key {})",
                 user->second.empty() ? "client" : user->second, address, KeyPrefix(key));
  } else {
    spdlog::warn("tcp client {} refused: {}", address,
                 mechanism != "CURVE" ? absl::StrCat("mechanism '", mechanism, "'")
                                      : absl::StrCat("CURVE key ", KeyPrefix(key), " not listed"));
  }
  // Reply: version, request id, status code, status text, user id, metadata.
  std::vector<zmq::message_t> reply;
  reply.emplace_back(std::string("1.0"));
  reply.emplace_back(frame(1));
  reply.emplace_back(std::string(admitted ? "200" : "400"));
  reply.emplace_back(std::string(admitted ? "OK" : "not an allowed CURVE client"));
  reply.emplace_back(admitted ? user->second : std::string());
  reply.emplace_back(std::string());
  zmq::send_multipart(socket_, reply);
}

}  // namespace kvp
