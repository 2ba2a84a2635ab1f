#include "kvpool/arena/fd_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {
namespace {

constexpr char kArena = 'A';
constexpr char kError = 'E';
constexpr char kMessage = 'M';
constexpr size_t kMaxMessage = 64 * 1024;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

absl::Status WaitReadable(int fd, int timeout_ms, absl::string_view what) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno(what);
  if (n == 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
  return absl::OkStatus();
}

// Sends one datagram: type byte + payload, with `fds` attached.
absl::Status SendDatagram(int sock, char type, absl::string_view payload,
                          absl::Span<const int> fds) {
  std::string data(1, type);
  data.append(payload.data(), payload.size());
  iovec iov{data.data(), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("sending on the fd channel");
  return absl::OkStatus();
}

struct Datagram {
  char type = 0;
  std::string payload;
  std::vector<UniqueFd> fds;
};

absl::StatusOr<Datagram> ReceiveDatagram(int sock, int timeout_ms) {
  RETURN_IF_ERROR(WaitReadable(sock, timeout_ms, "receiving on the fd channel"));
  std::string buffer(kMaxMessage + 1, '\0');
  iovec iov{buffer.data(), buffer.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxArenaChunks));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("receiving on the fd channel");
  Datagram d;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      d.fds.emplace_back(fd);
    }
  }
  if (n == 0) return absl::UnavailableError("the fd channel peer has gone");
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    return absl::InvalidArgumentError("fd channel message truncated");
  }
  d.type = buffer[0];
  d.payload.assign(buffer.data() + 1, static_cast<size_t>(n) - 1);
  return d;
}

absl::Status ErrorFromPayload(const std::string& payload) {
  if (payload.empty()) return absl::UnknownError("fd channel error without a code");
  const int code = static_cast<unsigned char>(payload[0]);
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("kvpoold: ", absl::string_view(payload).substr(1)));
}

}  // namespace

bool AllowList::Allows(const PeerCredentials& peer) const {
  return std::find(uids.begin(), uids.end(), peer.uid) != uids.end() ||
         std::find(gids.begin(), gids.end(), peer.gid) != gids.end();
}

absl::Status FdPeer::SendArena(const ArenaDescription& description, absl::Span<const int> fds) {
  if (fds.size() != description.chunk_bytes.size() || fds.size() > kMaxArenaChunks) {
    return absl::InvalidArgumentError(absl::StrCat("arena of ", description.chunk_bytes.size(),
                                                   " chunks sent with ", fds.size(), " fds"));
  }
  return SendDatagram(fd_.get(), kArena, EncodeArenaDescription(description), fds);
}

absl::Status FdPeer::SendError(const absl::Status& status) {
  std::string payload(1, static_cast<char>(status.code()));
  payload.append(status.message().data(), status.message().size());
  return SendDatagram(fd_.get(), kError, payload, {});
}

absl::Status FdPeer::Send(absl::string_view message) {
  if (message.size() > kMaxMessage)
    return absl::InvalidArgumentError("fd channel message too long");
  return SendDatagram(fd_.get(), kMessage, message, {});
}

absl::StatusOr<std::string> FdPeer::Receive(int timeout_ms) {
  ASSIGN_OR_RETURN(Datagram d, ReceiveDatagram(fd_.get(), timeout_ms));
  if (d.type == kError) return ErrorFromPayload(d.payload);
  if (d.type != kMessage) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected fd channel message type ", static_cast<int>(d.type)));
  }
  return std::move(d.payload);
}

absl::StatusOr<std::pair<ArenaDescription, std::vector<UniqueFd>>> FdPeer::ReceiveArena(
    int timeout_ms) {
  ASSIGN_OR_RETURN(Datagram d, ReceiveDatagram(fd_.get(), timeout_ms));
  if (d.type == kError) return ErrorFromPayload(d.payload);
  if (d.type != kArena) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected the arena, got message type ", static_cast<int>(d.type)));
  }
  ASSIGN_OR_RETURN(ArenaDescription desc,
                   DecodeArenaDescription(absl::MakeConstSpan(
                       reinterpret_cast<const uint8_t*>(d.payload.data()), d.payload.size())));
  if (desc.chunk_bytes.size() != d.fds.size()) {
    return absl::InvalidArgumentError(absl::StrCat("arena description names ",
                                                   desc.chunk_bytes.size(), " chunks but ",
                                                   d.fds.size(), " fds came"));
  }
  return std::make_pair(std::move(desc), std::move(d.fds));
}

absl::StatusOr<FdChannelServer> FdChannelServer::Listen(const std::string& path, AllowList allow) {
  ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  FdChannelServer server;
  server.listener_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!server.listener_.valid()) return Errno("creating the fd channel socket");
  ::unlink(path.c_str());
  // Created with mode 0600: no window in which another user could connect.
  const mode_t old_mask = ::umask(0177);
  const int bound =
      ::bind(server.listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old_mask);
  if (bound != 0) return Errno(absl::StrCat("binding ", path));
  if (::listen(server.listener_.get(), 64) != 0) return Errno(absl::StrCat("listening on ", path));
  server.path_ = path;
  server.allow_ = std::move(allow);
  return server;
}

FdChannelServer::~FdChannelServer() {
  if (listener_.valid() && !path_.empty()) ::unlink(path_.c_str());
}

absl::StatusOr<FdPeer> FdChannelServer::Accept(int timeout_ms) {
  RETURN_IF_ERROR(WaitReadable(listener_.get(), timeout_ms, "waiting for a peer"));
  UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn.valid()) return Errno("accepting on the fd channel");
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Errno("reading the peer's credentials");
  }
  FdPeer peer(std::move(conn), PeerCredentials{cred.pid, cred.uid, cred.gid});
  if (!allow_.Allows(peer.credentials())) {
    const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
        "uid ", cred.uid, " gid ", cred.gid, " (pid ", cred.pid, ") is not allowed to attach"));
    peer.SendError(refused).IgnoreError();
    return refused;
  }
  return peer;
}

absl::StatusOr<FdPeer> ConnectFdChannel(const std::string& path) {
  ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Errno("creating a socket");
  int rc;
  do {
    rc = ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return Errno(absl::StrCat("connecting to ", path));
  ucred cred{};
  socklen_t len = sizeof(cred);
  ::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
  return FdPeer(std::move(sock), PeerCredentials{cred.pid, cred.uid, cred.gid});
}

}  // namespace kvp
