// The names of migration transports (kvpool.capnp Transport), as logs, metrics labels and
// kvpoolctl print them. One place, so kvpoold and its clients say the same.
#pragma once

#include "protocol/kvpool.capnp.h"

namespace kvp {

inline const char* TransportName(wire::Transport transport) {
  switch (transport) {
    case wire::Transport::NONE: return "none";
    case wire::Transport::HOST: return "host";
    case wire::Transport::PEER_COPY: return "peer_copy";
    case wire::Transport::NCCL: return "nccl";
  }
  return "unknown";
}

}  // namespace kvp
