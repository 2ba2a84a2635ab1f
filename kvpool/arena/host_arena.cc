#include "kvpool/arena/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {
namespace {

absl::Status Errno(absl::string_view what) {
  const int e = errno;
  const std::string text = absl::StrCat(what, ": ", std::strerror(e));
  return e == ENOMEM ? absl::ResourceExhaustedError(text) : absl::InternalError(text);
}

}  // namespace

absl::StatusOr<AddressRange> AddressRange::Reserve(uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("reserving ", bytes, " bytes of address space"));
  AddressRange r;
  r.base_ = static_cast<uint8_t*>(p);
  r.bytes_ = bytes;
  return r;
}

AddressRange::AddressRange(AddressRange&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

AddressRange& AddressRange::operator=(AddressRange&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

AddressRange::~AddressRange() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

absl::Status AddressRange::MapShared(int fd, uint64_t offset, uint64_t bytes) {
  if (offset + bytes > bytes_) {
    return absl::OutOfRangeError(absl::StrCat("mapping [", offset, ", ", offset + bytes,
                                              ") exceeds the reserved ", bytes_, " bytes"));
  }
  void* p = ::mmap(base_ + offset, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("mapping fd ", fd, " at offset ", offset));
  return absl::OkStatus();
}

absl::StatusOr<HostArena> HostArena::Create(uint64_t chunk_bytes, uint64_t initial_bytes,
                                            uint64_t capacity_bytes) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (chunk_bytes == 0 || chunk_bytes % page != 0 || capacity_bytes < initial_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host arena: chunk of ", chunk_bytes, " bytes must be a non-zero multiple of the ", page,
        "-byte page, and capacity ", capacity_bytes, " must cover the initial ", initial_bytes));
  }
  HostArena arena;
  arena.chunk_bytes_ = chunk_bytes;
  const uint64_t chunks = (capacity_bytes + chunk_bytes - 1) / chunk_bytes;
  ASSIGN_OR_RETURN(arena.range_, AddressRange::Reserve(chunks * chunk_bytes));
  RETURN_IF_ERROR(arena.GrowTo(initial_bytes));
  return arena;
}

absl::StatusOr<HostArena> HostArena::Adopt(uint64_t chunk_bytes, std::vector<UniqueFd> fds) {
  if (fds.empty()) return absl::FailedPreconditionError("host arena: no chunks to adopt");
  HostArena arena;
  arena.chunk_bytes_ = chunk_bytes;
  ASSIGN_OR_RETURN(arena.range_, AddressRange::Reserve(chunk_bytes * fds.size()));
  for (size_t i = 0; i < fds.size(); ++i) {
    struct stat st {};
    if (::fstat(fds[i].get(), &st) != 0) return Errno(absl::StrCat("fstat of chunk ", i));
    // memfds seal; other files refuse F_GET_SEALS with EINVAL.
    if (!S_ISREG(st.st_mode) || ::fcntl(fds[i].get(), F_GET_SEALS) < 0 ||
        static_cast<uint64_t>(st.st_size) != chunk_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("host arena: chunk ", i, " is not a memfd of ", chunk_bytes,
                       " bytes (size ", st.st_size, ")"));
    }
    RETURN_IF_ERROR(arena.range_.MapShared(fds[i].get(), arena.mapped_bytes(), chunk_bytes));
    arena.fds_.push_back(std::move(fds[i]));
  }
  return arena;
}

absl::Status HostArena::GrowTo(uint64_t bytes) {
  if (bytes > range_.bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host arena: ", bytes, " bytes asked, capacity ", range_.bytes()));
  }
  while (mapped_bytes() < bytes) {
    const std::string name = absl::StrCat("kvpool-arena-", fds_.size());
    UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
    if (!fd.valid()) return Errno("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(chunk_bytes_)) != 0) {
      return Errno(absl::StrCat("sizing host arena chunk ", fds_.size()));
    }
    RETURN_IF_ERROR(range_.MapShared(fd.get(), mapped_bytes(), chunk_bytes_));
    fds_.push_back(std::move(fd));
  }
  return absl::OkStatus();
}

std::vector<uint64_t> HostArena::chunk_sizes() const {
  return std::vector<uint64_t>(fds_.size(), chunk_bytes_);
}

std::vector<int> HostArena::fds() const {
  std::vector<int> out;
  for (const UniqueFd& fd : fds_) out.push_back(fd.get());
  return out;
}

absl::StatusOr<HostArenaMapping> HostArenaMapping::Map(const std::vector<uint64_t>& chunk_bytes,
                                                       std::vector<UniqueFd> fds) {
  if (chunk_bytes.size() != fds.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host arena: ", chunk_bytes.size(), " chunk sizes for ", fds.size(), " fds"));
  }
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes) total += b;
  HostArenaMapping m;
  ASSIGN_OR_RETURN(m.range_, AddressRange::Reserve(total));
  uint64_t offset = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    RETURN_IF_ERROR(m.range_.MapShared(fds[i].get(), offset, chunk_bytes[i]));
    offset += chunk_bytes[i];
  }
  m.fds_ = std::move(fds);
  return m;
}

}  // namespace kvp
