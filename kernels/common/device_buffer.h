// DeviceBuffer: a move-only owner of one cudaMalloc allocation (tests, benchmarks, workers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/cuda_status.h"

namespace kvp {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) {
    DeviceBuffer b;
    if (bytes > 0) KVP_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.ptr_, bytes));
    b.bytes_ = bytes;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  absl::Status CopyFrom(const void* host, size_t bytes, size_t offset = 0) {
    KVP_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  absl::Status CopyTo(void* host, size_t bytes, size_t offset = 0) const {
    KVP_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status CopyFrom(const std::vector<T>& host) {
    return CopyFrom(host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  absl::Status CopyTo(std::vector<T>& host) const {
    return CopyTo(host.data(), host.size() * sizeof(T));
  }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host vector.
template <typename T>
absl::StatusOr<DeviceBuffer> ToDevice(const std::vector<T>& host) {
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(host.size() * sizeof(T));
  if (b.ok() && !host.empty()) {
    if (absl::Status s = b->CopyFrom(host); !s.ok()) return s;
  }
  return b;
}

}  // namespace kvp
