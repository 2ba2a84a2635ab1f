// The cuda backend's arena (docs/design.md §2): physical GPU memory from cuMemCreate in chunks with
// POSIX-fd shareable handles, mapped back to back into one reserved virtual range, growing by
// chunks up to a capacity. CudaArena owns the chunks (kvpoold); CudaArenaMapping imports received
// fds in another process, on the same GPU or, where peer access exists, on another GPU of the
// host. Both unmap and release on destruction. Move-only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {

// Chunks are large so that attaching takes few driver calls (64 for a 64 GiB arena).
inline constexpr uint64_t kDefaultCudaChunkBytes = uint64_t{1} << 30;

// A reserved virtual range with chunks mapped into it; the common part of owner and importer.
class CudaMappedRange {
 public:
  CudaMappedRange() = default;
  CudaMappedRange(CudaMappedRange&& o) noexcept;
  CudaMappedRange& operator=(CudaMappedRange&& o) noexcept;
  ~CudaMappedRange();

  static absl::StatusOr<CudaMappedRange> Reserve(uint64_t bytes);
  // Maps `handle` (taking ownership) at the end of what is mapped, readable and writable from
  // `access_device`.
  absl::Status Append(CUmemGenericAllocationHandle handle, uint64_t bytes, int access_device);

  uint8_t* base() const { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(base_)); }
  uint64_t mapped_bytes() const { return mapped_; }
  uint64_t capacity() const { return reserved_; }
  const std::vector<CUmemGenericAllocationHandle>& handles() const { return handles_; }
  const std::vector<uint64_t>& sizes() const { return sizes_; }

 private:
  void Reset();

  CUdeviceptr base_ = 0;
  uint64_t reserved_ = 0;
  uint64_t mapped_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  std::vector<uint64_t> sizes_;
};

class CudaArena {
 public:
  // REQUIRES: chunk_bytes is a multiple of the allocation granularity (2 MiB on the H200).
  static absl::StatusOr<CudaArena> Create(int device, uint64_t chunk_bytes, uint64_t initial_bytes,
                                          uint64_t capacity_bytes);

  // The chunks of an arena created earlier (by a kvpoold before a restart: fds kept in systemd's
  // fd store or handed back), imported and mapped on `device`, `chunk_bytes` each.
  // FAILED_PRECONDITION for a chunk of another device or one that does not map at that size.
  static absl::StatusOr<CudaArena> Adopt(int device, uint64_t chunk_bytes,
                                         std::vector<UniqueFd> fds);

  // The allocation granularity of `device` for shareable memory.
  static absl::StatusOr<uint64_t> Granularity(int device);

  // Adds chunks until at least `bytes` are mapped; RESOURCE_EXHAUSTED past the capacity.
  absl::Status GrowTo(uint64_t bytes);

  // A fresh fd per chunk, for one attaching process (the fds are the caller's). For adopted
  // chunks, duplicates of the fds they were adopted from: the driver refuses to export an
  // imported handle again (CUDA_ERROR_INVALID_VALUE, measured on the H200).
  absl::StatusOr<std::vector<UniqueFd>> ExportFds() const;

  int device() const { return device_; }
  uint8_t* base() const { return range_.base(); }
  uint64_t mapped_bytes() const { return range_.mapped_bytes(); }
  const std::vector<uint64_t>& chunk_sizes() const { return range_.sizes(); }

 private:
  int device_ = 0;
  uint64_t chunk_bytes_ = 0;
  CudaMappedRange range_;
  std::vector<UniqueFd> adopted_fds_;  // of the first chunks, when adopted
};

class CudaArenaMapping {
 public:
  // Imports and maps every chunk for use from `access_device` (the arena's device, or a peer of
  // it). The fds are kept: an imported handle cannot be exported again, and the fds let the
  // arena be handed back to a restarted kvpoold (docs/design.md §10).
  static absl::StatusOr<CudaArenaMapping> Map(int access_device,
                                              const std::vector<uint64_t>& chunk_bytes,
                                              std::vector<UniqueFd> fds);

  uint8_t* base() const { return range_.base(); }
  uint64_t bytes() const { return range_.mapped_bytes(); }
  const std::vector<UniqueFd>& fds() const { return fds_; }

 private:
  CudaMappedRange range_;
  std::vector<UniqueFd> fds_;
};

}  // namespace kvp
