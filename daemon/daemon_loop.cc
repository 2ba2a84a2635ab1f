#include "daemon/daemon_loop.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "daemon/http_endpoint.h"
#include "daemon/zap_handler.h"
#include "protocol/curve.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {
namespace {

absl::StatusOr<UniqueFd> BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) {
    return absl::InternalError("cannot block SIGTERM/SIGINT");
  }
  UniqueFd fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("signalfd: ", std::strerror(errno)));
  }
  return fd;
}

// A ROUTER socket with kvpoold's options, not yet bound.
zmq::socket_t NewRouter(zmq::context_t& context, size_t max_message_bytes) {
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.set(zmq::sockopt::router_handover, 1);  // a reconnecting client keeps its identity
  router.set(zmq::sockopt::sndtimeo, 1000);
  router.set(zmq::sockopt::linger, 0);
  // A hard cap far above the typed-error limit: bigger frames drop the connection unread.
  router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * max_message_bytes));
  return router;
}

absl::Status Bind(zmq::socket_t& socket, const std::string& endpoint) {
  try {
    socket.bind(endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("cannot bind ", endpoint, ": ", e.what()));
  }
  return absl::OkStatus();
}

// A link to a peer kvpoold: a CURVE client of its tcp endpoint, named by this node's name. Messages
// go out only on a connection that is up (immediate), never queued for a peer that is down.
absl::StatusOr<zmq::socket_t> NewLink(zmq::context_t& context, const PeerNode& peer,
                                      const std::string& node_name,
                                      const std::string& secret_key, size_t max_message_bytes) {
  ASSIGN_OR_RETURN(const CurveKeyPair own, CurveKeyPairFromSecret(secret_key));
  zmq::socket_t link(context, zmq::socket_type::dealer);
  link.set(zmq::sockopt::routing_id, node_name);
  link.set(zmq::sockopt::immediate, 1);
  link.set(zmq::sockopt::linger, 0);
  link.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(2 * max_message_bytes));
  UseCurveClientKeys(link, CurveClientKeys{.server_public_key = peer.public_key, .own = own});
  try {
    link.connect(peer.endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer.name, ": cannot connect to ", peer.endpoint, ": ", e.what()));
  }
  return link;
}

// Sends one message on a link; a peer that is down drops it (the broker's deadlines see to what
// waited for it).
void SendOnLink(zmq::socket_t& link, const std::string& name, Outgoing& message) {
  try {
    for (size_t i = 0; i < message.frames.size(); ++i) {
      const bool last = i + 1 == message.frames.size();
      const auto flags = zmq::send_flags::dontwait |
                         (last ? zmq::send_flags::none : zmq::send_flags::sndmore);
      if (!link.send(message.frames[i], flags)) {
        spdlog::debug("node {} is not connected; {} dropped", name, message.kind);
        return;
      }
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("cannot send to node {} ({}); message dropped", name, e.what());
  }
}

// The node a tcp connection authenticated as (ZapHandler's user id), or "" for a client.
std::string PeerNameOf(zmq::message_t& frame) {
  try {
    const absl::string_view user = frame.gets("User-Id");
    if (absl::StartsWith(user, kZapPeerUserPrefix)) {
      return std::string(user.substr(sizeof(kZapPeerUserPrefix) - 1));
    }
  } catch (const zmq::error_t&) {  // no user id: a client
  }
  return "";
}

// Sends one message on a ROUTER socket to `to`; a peer that has gone is logged, not fatal.
void Send(zmq::socket_t& router, absl::string_view to, Outgoing& message) {
  try {
    router.send(zmq::buffer(to.data(), to.size()), zmq::send_flags::sndmore);
    for (size_t i = 0; i < message.frames.size(); ++i) {
      const bool last = i + 1 == message.frames.size();
      if (!router.send(message.frames[i], last ? zmq::send_flags::none : zmq::send_flags::sndmore)) {
        spdlog::warn("send to a peer timed out; message dropped");
        return;
      }
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("cannot reach a peer ({}); message dropped", e.what());
  }
}

}  // namespace

DaemonLoop::DaemonLoop(DaemonOptions options, std::vector<const ServedArena*> arenas,
                       const PoolSet* pools, Broker* broker, const Clock* clock,
                       StateLog* state_log, CrashPoint* crash)
    : options_(std::move(options)),
      arenas_(std::move(arenas)),
      pools_(pools),
      broker_(broker),
      clock_(clock),
      state_log_(state_log),
      crash_(crash) {}

absl::Status DaemonLoop::Run() {
  ASSIGN_OR_RETURN(UniqueFd signals, BlockTerminationSignals());
  if (!absl::StartsWith(options_.endpoint, "ipc://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint ", options_.endpoint,
                     ": the local endpoint is ipc://; serve remote clients "
                     "with --tcp_endpoint, which requires CURVE keys (docs/design.md §8)"));
  }
  if (arenas_.size() != pools_->size() ||
      broker_->options().fd_channel_paths.size() != pools_->size()) {
    return absl::InternalError("an arena and an fd channel per pool, please");
  }
  std::vector<FdChannelServer> fd_channels;
  for (const std::string& path : broker_->options().fd_channel_paths) {
    ASSIGN_OR_RETURN(FdChannelServer channel, FdChannelServer::Listen(path, options_.allow));
    fd_channels.push_back(std::move(channel));
  }

  zmq::context_t context(1);
  zmq::socket_t router = NewRouter(context, broker_->options().limits.max_message_bytes);
  const mode_t old_umask = ::umask(0077);  // the ipc socket file: 0600
  const absl::Status bound = Bind(router, options_.endpoint);
  ::umask(old_umask);
  RETURN_IF_ERROR(bound);
  // Remote clients: CURVE encrypts and authenticates every connection, the ZAP handler admits
  // only listed client keys.
  std::unique_ptr<ZapHandler> zap;
  std::optional<zmq::socket_t> remote;
  const std::vector<PeerNode>& peers = broker_->options().peers;
  if (!peers.empty() && options_.tcp_endpoint.empty()) {
    return absl::InvalidArgumentError(
        "peers need the tcp endpoint: other nodes' kvpoolds connect to it (docs/design.md §11)");
  }
  if (!options_.tcp_endpoint.empty()) {
    absl::flat_hash_map<std::string, std::string> peer_keys;
    for (const PeerNode& peer : peers) peer_keys.emplace(peer.raw_key, peer.name);
    ASSIGN_OR_RETURN(zap, ZapHandler::Bind(context, options_.curve_clients, peer_keys));
    remote.emplace(NewRouter(context, broker_->options().limits.max_message_bytes));
    remote->set(zmq::sockopt::curve_server, 1);
    remote->set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
    remote->set(zmq::sockopt::zap_domain, "kvpool");
    RETURN_IF_ERROR(Bind(*remote, options_.tcp_endpoint));
    spdlog::info("serving tcp endpoint {} (CURVE, {} client keys and {} peers admitted)",
                 remote->get(zmq::sockopt::last_endpoint), options_.curve_clients.size(),
                 peers.size());
  }
  std::vector<zmq::socket_t> links;  // one per peer, in BrokerOptions::peers' order
  for (const PeerNode& peer : peers) {
    ASSIGN_OR_RETURN(zmq::socket_t link,
                     NewLink(context, peer, broker_->options().node_name,
                             options_.curve_secret_key,
                             broker_->options().limits.max_message_bytes));
    links.push_back(std::move(link));
    spdlog::info("node {}: linked to peer {} at {}", broker_->options().node_name, peer.name,
                 peer.endpoint);
  }
  const auto link_of = [&](absl::string_view name) -> zmq::socket_t* {
    for (size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].name == name) return &links[i];
    }
    return nullptr;
  };
  // Replies go out on the socket their peer came in on.
  const auto send = [&](Outgoing& o) {
    const absl::string_view to = o.to;
    if (absl::StartsWith(to, kLinkPrefix)) {
      const absl::string_view name = to.substr(kLinkPrefix.size());
      if (zmq::socket_t* link = link_of(name); link != nullptr) {
        SendOnLink(*link, std::string(name), o);
      } else {
        spdlog::error("a message to node '{}', no peer, dropped", std::string(name));
      }
    } else if (remote.has_value() && absl::StartsWith(to, kPeerPrefix)) {
      const absl::string_view rest = to.substr(kPeerPrefix.size());
      Send(*remote, rest.substr(std::min(rest.size(), rest.find('/') + 1)), o);
    } else if (remote.has_value() && IsRemotePeer(to)) {
      Send(*remote, to.substr(kRemotePeerPrefix.size()), o);
    } else if (absl::StartsWith(to, kLocalPeerPrefix)) {
      Send(router, to.substr(kLocalPeerPrefix.size()), o);
    } else {
      spdlog::error("a message to '{}', a peer of no endpoint, dropped", std::string(to));
    }
  };
  CrashPoint never;
  CrashPoint& crash = crash_ != nullptr ? *crash_ : never;
  broker_->set_receive_hook([&](const char* kind) { crash.Reached("receive", kind); });
  const absl::Cleanup no_hook = [&] { broker_->set_receive_hook(nullptr); };
  // What handling one message or tick changed goes to the state log before anything is sent,
  // so that no client hears of a change the log does not have. A log that cannot be written
  // ends kvpoold (the log would no longer describe the pools) without sending anything.
  absl::Status fatal;
  Outbox out;
  const auto log_and_send = [&](const char* kind) {
    if (state_log_ != nullptr && fatal.ok()) {
      fatal = state_log_->Flush();
      if (!fatal.ok()) spdlog::error("the state log cannot be written: {}", fatal.ToString());
    }
    if (!fatal.ok()) {
      out.clear();
      return;
    }
    crash.Reached("log", kind);
    for (Outgoing& o : out) {
      send(o);
      crash.Reached("send", o.kind);
    }
    out.clear();
  };
  // Hands what `socket` has ready to the broker, identities prefixed with `prefix`; returns to the
  // other sources now and then.
  const auto drain = [&](zmq::socket_t& socket, absl::string_view prefix) {
    for (int i = 0; i < 256; ++i) {
      std::vector<zmq::message_t> frames;
      try {
        if (!zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          break;
        }
      } catch (const zmq::error_t& e) {  // a signal, or a peer's connection torn mid-message
        spdlog::warn("receiving a message: {}", e.what());
        break;
      }
      if (frames.size() < 2) continue;  // an identity with nothing after it
      // A peer kvpoold on the tcp endpoint is named by the node its key is listed for.
      const std::string peer = prefix == kRemotePeerPrefix ? PeerNameOf(frames[1]) : "";
      const std::string from =
          peer.empty() ? absl::StrCat(prefix, frames.front().to_string())
                       : absl::StrCat(kPeerPrefix, peer, "/", frames.front().to_string());
      frames.erase(frames.begin());
      log_and_send(broker_->Handle(from, std::move(frames), out));
      if (!fatal.ok()) break;
    }
  };

  // What a link to a peer brings: that peer's answers (no identity frame on a DEALER).
  const auto drain_link = [&](size_t i) {
    const std::string from = absl::StrCat(kLinkPrefix, peers[i].name);
    for (int n = 0; n < 256; ++n) {
      std::vector<zmq::message_t> frames;
      try {
        if (!zmq::recv_multipart(links[i], std::back_inserter(frames),
                                 zmq::recv_flags::dontwait)) {
          break;
        }
      } catch (const zmq::error_t& e) {
        spdlog::warn("receiving from node {}: {}", peers[i].name, e.what());
        break;
      }
      if (frames.empty()) continue;
      log_and_send(broker_->Handle(from, std::move(frames), out));
      if (!fatal.ok()) break;
    }
  };

  HttpEndpoint http;
  // Live while the loop ticks; a compaction (0.3 s for 100,000 sequences) is far inside this.
  http.set_stale_after_ms(std::max<int64_t>(10000, 20 * int64_t{options_.tick_millis}));
  if (options_.metrics_port >= 0) {
    RETURN_IF_ERROR(http.Start(options_.metrics_host, options_.metrics_port));
    spdlog::info("metrics at http://{}:{}/metrics", options_.metrics_host, http.port());
  }
  for (PoolIndex i = 0; i < pools_->size(); ++i) {
    spdlog::info("pool {}: {} fd_channel={} blocks={} block_bytes={}", i,
                 arenas_[i]->device() < 0 ? std::string("host")
                                          : absl::StrCat("gpu ", arenas_[i]->device()),
                 broker_->options().fd_channel_paths[i], pools_->pool(i).blocks().num_blocks(),
                 pools_->layout().block_stride());
  }
  spdlog::info("kvpoold serving endpoint={} pools={} {}", options_.endpoint, pools_->size(),
               pools_->layout().spec().DebugString());
  sd_notify(0, "READY=1\nSTATUS=serving");
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0;

  const auto describe = [&](PoolIndex i) {
    ArenaDescription description;
    description.epoch = broker_->options().epoch;
    description.arena_id = i < options_.arena_ids.size() ? options_.arena_ids[i] : 0;
    description.num_blocks = pools_->pool(i).blocks().num_blocks();
    description.spec = pools_->layout().spec();
    return description;
  };
  // Hands pool i's arena to the peer waiting on its fd channel.
  const auto hand_over = [&](PoolIndex i) {
    absl::StatusOr<FdPeer> peer = fd_channels[i].Accept(0);
    if (peer.ok()) {
      const absl::Status sent = arenas_[i]->SendTo(*peer, describe(i));
      if (sent.ok()) {
        spdlog::info("arena of pool {} handed to pid {}", i, peer->credentials().pid);
      } else {
        spdlog::warn("handing the arena of pool {} to pid {} failed: {}", i,
                     peer->credentials().pid, sent.ToString());
      }
    } else if (!absl::IsDeadlineExceeded(peer.status())) {
      spdlog::warn("fd channel of pool {}: {}", i, peer.status().ToString());
    }
  };

  int64_t next_tick = clock_->NowMicros();
  int64_t next_watchdog = next_tick;
  int64_t drain_deadline = 0;
  while (true) {
    // The sockets, then one fd channel per pool.
    std::vector<zmq::pollitem_t> items = {{router.handle(), 0, ZMQ_POLLIN, 0},
                                          {nullptr, signals.get(), ZMQ_POLLIN, 0}};
    const size_t remote_item = items.size();
    if (remote.has_value()) items.push_back({remote->handle(), 0, ZMQ_POLLIN, 0});
    const size_t zap_item = items.size();
    if (zap != nullptr) items.push_back({zap->socket().handle(), 0, ZMQ_POLLIN, 0});
    const size_t first_link = items.size();
    for (zmq::socket_t& link : links) items.push_back({link.handle(), 0, ZMQ_POLLIN, 0});
    const size_t first_channel = items.size();
    for (const FdChannelServer& channel : fd_channels) {
      items.push_back({nullptr, channel.fd(), ZMQ_POLLIN, 0});
    }
    const int64_t wait_ms = std::max<int64_t>(0, (next_tick - clock_->NowMicros()) / 1000);
    zmq::poll(items, std::chrono::milliseconds(wait_ms));
    if (items[0].revents & ZMQ_POLLIN) drain(router, kLocalPeerPrefix);
    if (remote.has_value() && (items[remote_item].revents & ZMQ_POLLIN)) {
      drain(*remote, kRemotePeerPrefix);
    }
    if (zap != nullptr && (items[zap_item].revents & ZMQ_POLLIN)) zap->AnswerOne();
    for (size_t i = 0; i < links.size(); ++i) {
      if (items[first_link + i].revents & ZMQ_POLLIN) drain_link(i);
    }
    for (PoolIndex i = 0; i < fd_channels.size(); ++i) {
      if (items[first_channel + i].revents & ZMQ_POLLIN) hand_over(i);
    }
    if ((items[1].revents & ZMQ_POLLIN) && !broker_->draining()) {
      signalfd_siginfo info{};
      (void)!::read(signals.get(), &info, sizeof(info));
      spdlog::info("signal {}: draining ({} ms at most)", info.ssi_signo,
                   options_.drain_timeout_millis);
      sd_notify(0, "STOPPING=1\nSTATUS=draining");
      broker_->StartDrain();
      drain_deadline = clock_->NowMicros() + options_.drain_timeout_millis * 1000;
    }
    const int64_t now = clock_->NowMicros();
    if (now >= next_tick) {
      broker_->Tick(out);
      log_and_send("tick");
      if (state_log_ != nullptr && fatal.ok()) fatal = state_log_->CompactIfLarge();
      http.Publish(broker_->MetricsText(), broker_->draining(), broker_->NotReady());
      next_tick = now + options_.tick_millis * 1000;
    }
    if (watchdog && now >= next_watchdog) {
      sd_notify(0, "WATCHDOG=1");
      next_watchdog = now + static_cast<int64_t>(watchdog_usec / 2);
    }
    if (!fatal.ok()) return fatal;
    if (broker_->draining()) {
      if (broker_->Idle()) {
        spdlog::info("drained; exiting");
        return absl::OkStatus();
      }
      if (now >= drain_deadline) {
        return absl::DeadlineExceededError("the drain timed out with jobs still running");
      }
    }
  }
}

}  // namespace kvp
