// The names of migration transports (kvpool.capnp Transport), as logs, metrics labels and
// kvpoolctl print them. One place, so kvpoold and its clients say the same.
#pragma once

#include <optional>
#include <string_view>

#include "protocol/kvpool.capnp.h"

namespace kvp {

inline const char* TransportName(wire::Transport transport) {
  switch (transport) {
    case wire::Transport::NONE: return "none";
    case wire::Transport::HOST: return "host";
    case wire::Transport::PEER_COPY: return "peer_copy";
    case wire::Transport::NCCL: return "nccl";
    case wire::Transport::SOCKET: return "socket";
  }
  return "unknown";
}

// The transport named `name` (as TransportName prints it), for flags; nullopt for another name.
inline std::optional<wire::Transport> TransportNamed(std::string_view name) {
  for (wire::Transport t : {wire::Transport::HOST, wire::Transport::PEER_COPY,
                            wire::Transport::NCCL, wire::Transport::SOCKET}) {
    if (name == TransportName(t)) return t;
  }
  return std::nullopt;
}

// Paired transports move bytes between a worker of each pool (TransferLink); the others are
// pulled by the receiver alone from the mapped source arena.
inline bool IsPaired(wire::Transport transport) {
  return transport == wire::Transport::NCCL || transport == wire::Transport::SOCKET;
}

}  // namespace kvp
