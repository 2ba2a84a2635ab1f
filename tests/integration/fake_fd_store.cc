#include "tests/integration/fake_fd_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"

namespace kvp::testing {

absl::StatusOr<std::unique_ptr<FakeFdStore>> FakeFdStore::Listen(const std::string& socket_path) {
  std::unique_ptr<FakeFdStore> s(new FakeFdStore());
  s->path_ = socket_path;
  s->socket_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError("long path");
  std::strcpy(addr.sun_path, socket_path.c_str());
  ::unlink(socket_path.c_str());
  if (!s->socket_.valid() ||
      ::bind(s->socket_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::InternalError(absl::StrCat("binding ", socket_path, ": ", std::strerror(errno)));
  }
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

FakeFdStore::~FakeFdStore() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
}

bool FakeFdStore::ReadOne(int timeout_ms) {
  pollfd p{socket_.get(), POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char text[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  iovec iov{text, sizeof(text) - 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return false;
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  bool store = false, remove = false;
  std::string name = "stored";
  for (absl::string_view line : absl::StrSplit(absl::string_view(text, n), '\n')) {
    if (line == "FDSTORE=1") store = true;
    if (line == "FDSTOREREMOVE=1") remove = true;
    if (absl::StartsWith(line, "FDNAME=")) name = std::string(line.substr(7));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (store && fds.size() == 1) stored_[name] = std::move(fds[0]);
  if (remove) stored_.erase(name);
  return true;
}

void FakeFdStore::Serve() {
  while (!stop_) ReadOne(20);
}

void FakeFdStore::Drain() {
  // The serving thread reads; wait until a poll finds nothing left.
  for (int i = 0; i < 500; ++i) {
    pollfd p{socket_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a message being handled
      if (::poll(&p, 1, 0) == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<std::string> FakeFdStore::names() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, fd] : stored_) out.push_back(name);
  return out;
}

std::vector<int> FakeFdStore::fds() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [name, fd] : stored_) out.push_back(fd.get());
  return out;
}

std::string FakeFdStore::joined_names() { return absl::StrJoin(names(), ":"); }

void FakeFdStore::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  stored_.clear();
}

}  // namespace kvp::testing
