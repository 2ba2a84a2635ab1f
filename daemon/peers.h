// The other nodes' kvpoolds (docs/design.md §11): kvpoold --peers_file lists them, one a line:
//
//   # name   endpoint              CURVE public key (Z85)
//   b        tcp://10.0.0.2:7001   rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7
//
// A peer's name is what clients write in a node-qualified pool ("b/1"); its endpoint is its
// kvpoold's --tcp_endpoint; its key is that endpoint's public key, which this kvpoold's link to it
// checks, and which this kvpoold's own tcp endpoint admits as that peer (a key listed both here
// and as a client is refused: one key, one role). Both sides must list each other.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvp {

struct PeerNode {
  std::string name;
  std::string endpoint;    // tcp://HOST:PORT
  std::string public_key;  // Z85
  std::string raw_key;     // its 32 bytes, as ZAP requests carry them
};

// OK for a node name: 1 to 63 of [a-z0-9-], starting with a letter or digit (a DNS label, so a
// Kubernetes node or pod name fits).
absl::Status CheckNodeName(absl::string_view name);

// The peers of a peers file's text; blank lines and lines starting with '#' are skipped.
// INVALID_ARGUMENT naming `path`:line for a malformed line, a repeated name, endpoint or key, or a
// peer named `own_name`.
absl::StatusOr<std::vector<PeerNode>> ParsePeers(absl::string_view text, absl::string_view path,
                                                 absl::string_view own_name);
absl::StatusOr<std::vector<PeerNode>> ReadPeersFile(const std::string& path,
                                                    absl::string_view own_name);

}  // namespace kvp
