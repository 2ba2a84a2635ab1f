#include "worker/socket_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

// The stream's header (docs/protocol.md, "Socket moves"), little-endian: magic, version, link id,
// token length, the pieces and their bytes; then the token, then every piece's bytes in order.
constexpr uint32_t kMagic = 0x4d50564b;  // "KVPM"
constexpr uint32_t kVersion = 1;
constexpr uint8_t kAck = 'K';
constexpr size_t kMaxToken = 64;  // as the schema bounds it
struct Header {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t link = 0;
  uint32_t token_bytes = 0;
  uint32_t pieces = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 32);
static_assert(std::endian::native == std::endian::little, "the header is written as it lies");

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Waits until `fd` is ready for `events`; DEADLINE_EXCEEDED when the deadline passes first.
absl::Status Await(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return absl::OkStatus();
    if (n == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("the link's deadline passed while waiting to ", what));
    }
    if (errno != EINTR) return Errno(absl::StrCat("poll while waiting to ", what));
  }
}

absl::Status WriteAll(int fd, const uint8_t* data, uint64_t n, Clock::time_point deadline) {
  while (n > 0) {
    RETURN_IF_ERROR(Await(fd, POLLOUT, deadline, "send"));
    const ssize_t w = ::send(fd, data, std::min<uint64_t>(n, 1 << 30), MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("send to the receiver");
    }
    data += w;
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, uint8_t* data, uint64_t n, Clock::time_point deadline) {
  while (n > 0) {
    RETURN_IF_ERROR(Await(fd, POLLIN, deadline, "receive"));
    const ssize_t r = ::recv(fd, data, std::min<uint64_t>(n, 1 << 30), 0);
    if (r == 0) {
      return absl::UnavailableError(
          absl::StrCat("the peer closed the connection with ", n, " bytes still to come"));
    }
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("receive from the peer");
    }
    data += r;
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// "a.b.c.d:port" or "[v6]:port" into an address; INVALID_ARGUMENT otherwise.
absl::StatusOr<sockaddr_storage> ParseEndpoint(const std::string& endpoint, socklen_t* length) {
  const size_t colon = endpoint.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) ||
      port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous '", endpoint, "' is not host:port"));
  }
  std::string host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  sockaddr_storage address{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous '", endpoint, "' has no numeric IPv4 or IPv6 address"));
  }
  return address;
}

std::string EndpointOf(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(v4->sin_port));
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
  ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
  return absl::StrCat("[", host, "]:", ntohs(v6->sin6_port));
}

UniqueFd StreamSocket(int family) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.valid()) {
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

struct Stream {
  std::vector<MovePiece> pieces;
  uint64_t bytes = 0;
};

absl::StatusOr<Stream> StreamOf(const MigrateWork& work, const OwnArena& arena) {
  Stream s;
  s.pieces = PiecesOf(work.moves, arena.block_stride, work.link->source_chunk_bytes,
                      work.link->target_chunk_bytes);
  for (const MovePiece& p : s.pieces) s.bytes += p.bytes;
  if (work.link->token.size() > kMaxToken) {
    return absl::InvalidArgumentError("the link's token is longer than 64 bytes");
  }
  return s;
}

bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;  // in constant time: a wrong token says nothing about the right one
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

// Reads a connection's header and token: OK only for this link's stream with its exact size.
absl::Status CheckHeader(int fd, const MigrateWork& work, const Stream& stream,
                         Clock::time_point deadline) {
  Header h;
  RETURN_IF_ERROR(ReadAll(fd, reinterpret_cast<uint8_t*>(&h), sizeof(h), deadline));
  if (h.magic != kMagic || h.version != kVersion) {
    return absl::InvalidArgumentError("not a kvpool socket move (magic or version)");
  }
  if (h.token_bytes > kMaxToken) return absl::InvalidArgumentError("a token over 64 bytes");
  std::string token(h.token_bytes, '\0');
  RETURN_IF_ERROR(ReadAll(fd, reinterpret_cast<uint8_t*>(token.data()), token.size(), deadline));
  if (h.link != work.link->id || !SameToken(token, work.link->token)) {
    return absl::PermissionDeniedError("a connection without this link's id and token");
  }
  if (h.pieces != stream.pieces.size() || h.bytes != stream.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sender streams ", h.pieces, " pieces of ", h.bytes, " bytes; the move is ",
        stream.pieces.size(), " of ", stream.bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SocketTransport::Open(const MigrateWork& work) {
  listener_.Reset();
  socklen_t length = 0;
  ASSIGN_OR_RETURN(sockaddr_storage address,
                   ParseEndpoint(absl::StrCat(options_.listen_address, ":1"), &length));
  if (address.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&address)->sin_port = 0;  // any free port
  } else {
    reinterpret_cast<sockaddr_in6*>(&address)->sin6_port = 0;
  }
  UniqueFd fd = StreamSocket(address.ss_family);
  if (!fd.valid()) return Errno("socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    return Errno(absl::StrCat("bind to ", options_.listen_address));
  }
  if (::listen(fd.get(), 4) != 0) return Errno("listen");
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Errno("getsockname");
  }
  listener_ = std::move(fd);
  listener_link_ = work.link->id;
  return EndpointOf(address);
}

absl::Status SocketTransport::Receive(const MigrateWork& work) {
  ASSIGN_OR_RETURN(const Stream stream, StreamOf(work, arena_));
  if (!listener_.valid() || listener_link_ != work.link->id) {
    return absl::FailedPreconditionError(
        absl::StrCat("link ", work.link->id, " was not opened here (socket links are fresh)"));
  }
  const UniqueFd listener = std::move(listener_);
  const Clock::time_point deadline = work.link->deadline;
  // Connections that are not this link's sender are closed, and the wait goes on.
  for (;;) {
    RETURN_IF_ERROR(Await(listener.get(), POLLIN, deadline, "accept the sender"));
    UniqueFd connection(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!connection.valid()) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return Errno("accept");
    }
    const Clock::time_point header_deadline =
        std::min(deadline, Clock::now() + options_.header_timeout);
    const absl::Status header = CheckHeader(connection.get(), work, stream, header_deadline);
    if (!header.ok() && Clock::now() >= deadline) return header;
    if (absl::IsDeadlineExceeded(header)) {
      spdlog::warn("link {}: closed a connection that sent no header within {} ms",
                   work.link->id, options_.header_timeout.count());
      continue;
    }
    if (!header.ok()) {
      spdlog::warn("link {}: closed a connection: {}", work.link->id, header.ToString());
      continue;
    }
    for (const MovePiece& p : stream.pieces) {
      RETURN_IF_ERROR(ReadAll(connection.get(), arena_.base + p.target_offset, p.bytes, deadline));
    }
    return WriteAll(connection.get(), &kAck, 1, deadline);
  }
}

absl::Status SocketTransport::Send(const MigrateWork& work) {
  ASSIGN_OR_RETURN(const Stream stream, StreamOf(work, arena_));
  const Clock::time_point deadline = work.link->deadline;
  socklen_t length = 0;
  ASSIGN_OR_RETURN(const sockaddr_storage address, ParseEndpoint(work.link->rendezvous, &length));
  UniqueFd fd = StreamSocket(address.ss_family);
  if (!fd.valid()) return Errno("socket");
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0 &&
      errno != EINPROGRESS) {
    return Errno(absl::StrCat("connect to the receiver at ", work.link->rendezvous));
  }
  RETURN_IF_ERROR(Await(fd.get(), POLLOUT, deadline, "connect"));
  int error = 0;
  socklen_t error_length = sizeof(error);
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &error_length);
  if (error != 0) {
    errno = error;
    return Errno(absl::StrCat("connect to the receiver at ", work.link->rendezvous));
  }
  Header h;
  h.link = work.link->id;
  h.token_bytes = static_cast<uint32_t>(work.link->token.size());
  h.pieces = static_cast<uint32_t>(stream.pieces.size());
  h.bytes = stream.bytes;
  RETURN_IF_ERROR(WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(&h), sizeof(h), deadline));
  RETURN_IF_ERROR(WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(work.link->token.data()),
                           work.link->token.size(), deadline));
  // Paced in slices when a rate is set: the slice's share of the time, slept off when ahead.
  constexpr uint64_t kSlice = uint64_t{1} << 20;
  const Clock::time_point start = Clock::now();
  uint64_t sent = 0;
  for (const MovePiece& p : stream.pieces) {
    for (uint64_t off = 0; off < p.bytes; off += kSlice) {
      const uint64_t n = std::min(kSlice, p.bytes - off);
      RETURN_IF_ERROR(WriteAll(fd.get(), arena_.base + p.source_offset + off, n, deadline));
      sent += n;
      if (options_.max_bytes_per_second > 0) {
        const auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                                     1e6 * static_cast<double>(sent) /
                                     static_cast<double>(options_.max_bytes_per_second)));
        if (due > deadline) {
          return absl::DeadlineExceededError("the pace set cannot finish the move by its deadline");
        }
        std::this_thread::sleep_until(due);
      }
    }
  }
  uint8_t ack = 0;
  RETURN_IF_ERROR(ReadAll(fd.get(), &ack, 1, deadline));
  if (ack != kAck) return absl::DataLossError("the receiver did not acknowledge the move");
  return absl::OkStatus();
}

}  // namespace kvp
