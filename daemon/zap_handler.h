// Admits a CURVE client of kvpoold's tcp:// endpoint only when its public key is on the allow
// list (docs/design.md §8). ZeroMQ asks about every handshake over the ZAP protocol (ZeroMQ RFC 27)
// on inproc://zeromq.zap.01 of the socket's context; without a handler there, any client that knows
// kvpoold's public key would get in. The daemon loop polls socket() and calls AnswerOne.
#pragma once

#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace kvp {

inline constexpr char kZapPeerUserPrefix[] = "peer:";

class ZapHandler {
 public:
  // `allowed` holds raw 32-byte public keys (ReadCurveKeyListFile) of clients; `peers` maps the
  // raw keys of other nodes' kvpoolds to their node names, which become the connection's ZAP user
  // id (the "User-Id" of its messages, kZapPeerUserPrefix and the name). Bind before any CURVE
  // socket of `context` accepts connections. INVALID_ARGUMENT for a key listed as both.
  static absl::StatusOr<std::unique_ptr<ZapHandler>> Bind(
      zmq::context_t& context, const std::vector<std::string>& allowed,
      const absl::flat_hash_map<std::string, std::string>& peers = {});

  zmq::socket_t& socket() { return socket_; }
  // Reads one waiting request and answers it: 200 for a listed CURVE key, 400 otherwise.
  void AnswerOne();

 private:
  ZapHandler(zmq::socket_t socket, absl::flat_hash_map<std::string, std::string> users)
      : socket_(std::move(socket)), users_(std::move(users)) {}

  zmq::socket_t socket_;
  absl::flat_hash_map<std::string, std::string> users_;  // raw key -> ZAP user id ("": client)
};

}  // namespace kvp
