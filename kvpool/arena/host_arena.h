// The host backend's arena (docs/design.md §2): memfd_create chunks mapped back to back into one
// reserved address range, so block b is always at base + b · stride however the arena grew.
// HostArena owns the chunks (kvpoold); HostArenaMapping maps received chunk fds into another
// process. Both unmap on destruction. Move-only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {

// An anonymous PROT_NONE reservation of address space, released on destruction.
class AddressRange {
 public:
  static absl::StatusOr<AddressRange> Reserve(uint64_t bytes);
  AddressRange() = default;
  AddressRange(AddressRange&& o) noexcept;
  AddressRange& operator=(AddressRange&& o) noexcept;
  ~AddressRange();

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

  // Maps `bytes` of `fd` (shared, read-write) at base + offset, replacing the reservation there.
  absl::Status MapShared(int fd, uint64_t offset, uint64_t bytes);

 private:
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
};

class HostArena {
 public:
  // Reserves `capacity_bytes` of address space and maps `initial_bytes` (rounded up to whole
  // chunks) now. REQUIRES: chunk_bytes is a multiple of the page size.
  static absl::StatusOr<HostArena> Create(uint64_t chunk_bytes, uint64_t initial_bytes,
                                          uint64_t capacity_bytes);

  // The chunks of an arena created earlier (by a kvpoold before a restart, kept in systemd's fd
  // store): each must be a memfd of `chunk_bytes`, else FAILED_PRECONDITION naming the chunk.
  static absl::StatusOr<HostArena> Adopt(uint64_t chunk_bytes, std::vector<UniqueFd> fds);

  // Adds chunks until at least `bytes` are mapped; RESOURCE_EXHAUSTED past the capacity.
  absl::Status GrowTo(uint64_t bytes);

  uint8_t* base() const { return range_.base(); }
  uint64_t mapped_bytes() const { return chunk_bytes_ * fds_.size(); }
  std::vector<uint64_t> chunk_sizes() const;
  std::vector<int> fds() const;  // borrowed; send them, do not close them

 private:
  uint64_t chunk_bytes_ = 0;
  AddressRange range_;
  std::vector<UniqueFd> fds_;
};

// Another process's view of a host arena: every chunk mapped back to back.
class HostArenaMapping {
 public:
  // Takes ownership of `fds` and keeps them: the mappings hold the memory, the fds let it be
  // handed back to a restarted kvpoold (docs/design.md §10).
  static absl::StatusOr<HostArenaMapping> Map(const std::vector<uint64_t>& chunk_bytes,
                                              std::vector<UniqueFd> fds);

  uint8_t* base() const { return range_.base(); }
  uint64_t bytes() const { return range_.bytes(); }
  const std::vector<UniqueFd>& fds() const { return fds_; }

 private:
  AddressRange range_;
  std::vector<UniqueFd> fds_;
};

}  // namespace kvp
