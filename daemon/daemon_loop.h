// kvpoold's event loop: one thread polls the ROUTER socket (and, when serving tcp://, a second
// ROUTER with CURVE and its ZAP handler), each pool's fd channel and a signalfd, feeds the Broker and
// sends what it returns (and, across nodes, polls a DEALER link to each peer kvpoold, design.md
// §11); every tick it reaps leases, publishes metrics and pings
// systemd's watchdog. SIGTERM or SIGINT starts a drain: new work is refused, jobs in flight
// finish (or the drain times out), then Run returns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/broker.h"
#include "daemon/crash_points.h"
#include "daemon/served_arena.h"
#include "daemon/state/state_log.h"
#include "kvpool/arena/fd_channel.h"
#include "kvpool/pool/pool_set.h"

namespace kvp {

struct DaemonOptions {
  std::string endpoint;  // ipc://...: workers and local clients
  // Optional tcp://... for remote clients, CURVE only: kvpoold's secret key (Z85) and the raw
  // 32-byte public keys of the clients it admits. Peers are named kLocalPeerPrefix or
  // kRemotePeerPrefix and their routing id (daemon/broker.h). The other nodes' kvpoolds
  // (BrokerOptions::peers) are admitted there too, by their keys, and reached over a link each
  // (a CURVE DEALER with this secret key).
  std::string tcp_endpoint;
  std::string curve_secret_key;
  std::vector<std::string> curve_clients;
  AllowList allow;
  std::string metrics_host = "127.0.0.1";
  int metrics_port = -1;       // -1: no HTTP endpoint; 0: any free port
  int tick_millis = 50;
  int64_t drain_timeout_millis = 30'000;
  // Per pool: the id its arena is handed out with (ArenaDescription::arena_id, the state log's
  // pool id); none: 0.
  std::vector<uint64_t> arena_ids;
  // The fd channel's path, the epoch and the message size limit are the Broker's options.
};

class DaemonLoop {
 public:
  // Blocks SIGTERM and SIGINT in this thread and every thread started after (call it before
  // starting threads). `arenas` has one entry per pool, each served on the pool's fd channel
  // (BrokerOptions::fd_channel_paths). With a `state_log`, the changes of every message and tick
  // are logged before anything is sent (docs/design.md §10); `crash` (tests) may end the process
  // at a chosen step. REQUIRES: everything passed outlives the loop.
  DaemonLoop(DaemonOptions options, std::vector<const ServedArena*> arenas, const PoolSet* pools,
             Broker* broker, const Clock* clock, StateLog* state_log = nullptr,
             CrashPoint* crash = nullptr);

  // Binds, serves until a signal's drain ends, returns OK on a clean exit.
  absl::Status Run();

 private:
  DaemonOptions options_;
  std::vector<const ServedArena*> arenas_;
  const PoolSet* pools_;
  Broker* broker_;
  const Clock* clock_;
  StateLog* state_log_;
  CrashPoint* crash_;
};

}  // namespace kvp
