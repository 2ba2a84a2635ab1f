#include "kvpool/arena/cuda_arena.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/arena/cuda_driver.h"

namespace kvp {
namespace {

CUmemAllocationProp Prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Makes `device`'s primary context current, which the driver calls below need.
absl::Status UseDevice(int device) {
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(e)));
  }
  if (const cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, ": ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

// The allocation behind an exported chunk fd (the fd stays the caller's).
absl::StatusOr<CUmemGenericAllocationHandle> ImportChunk(const CudaDriver* d, const UniqueFd& fd,
                                                         size_t chunk) {
  CUmemGenericAllocationHandle handle;
  KVP_CU_RETURN_IF_ERROR(
      d->MemImportFromShareableHandle(&handle,
                                      reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      absl::StrCat("importing chunk ", chunk));
  return handle;
}

}  // namespace

CudaMappedRange::CudaMappedRange(CudaMappedRange&& o) noexcept { *this = std::move(o); }

CudaMappedRange& CudaMappedRange::operator=(CudaMappedRange&& o) noexcept {
  if (this != &o) {
    Reset();
    base_ = std::exchange(o.base_, 0);
    reserved_ = std::exchange(o.reserved_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    handles_ = std::move(o.handles_);
    sizes_ = std::move(o.sizes_);
    o.handles_.clear();
    o.sizes_.clear();
  }
  return *this;
}

CudaMappedRange::~CudaMappedRange() { Reset(); }

void CudaMappedRange::Reset() {
  if (base_ == 0) return;
  if (auto d = CudaDriver::Get(); d.ok()) {
    if (mapped_ > 0) (*d)->MemUnmap(base_, mapped_);
    for (CUmemGenericAllocationHandle h : handles_) (*d)->MemRelease(h);
    (*d)->MemAddressFree(base_, reserved_);
  }
  base_ = 0;
  reserved_ = mapped_ = 0;
  handles_.clear();
  sizes_.clear();
}

absl::StatusOr<CudaMappedRange> CudaMappedRange::Reserve(uint64_t bytes) {
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  CudaMappedRange r;
  KVP_CU_RETURN_IF_ERROR(d->MemAddressReserve(&r.base_, bytes, 0, 0, 0),
                         absl::StrCat("reserving ", bytes, " bytes of GPU address space"));
  r.reserved_ = bytes;
  return r;
}

absl::Status CudaMappedRange::Append(CUmemGenericAllocationHandle handle, uint64_t bytes,
                                     int access_device) {
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  if (mapped_ + bytes > reserved_) {
    d->MemRelease(handle);
    return absl::ResourceExhaustedError(
        absl::StrCat("chunk of ", bytes, " bytes exceeds the ", reserved_, "-byte range"));
  }
  const CUdeviceptr at = base_ + mapped_;
  if (const CUresult r = d->MemMap(at, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    d->MemRelease(handle);
    return CuStatus(r, absl::StrCat("mapping chunk ", handles_.size()));
  }
  handles_.push_back(handle);
  sizes_.push_back(bytes);
  mapped_ += bytes;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = access_device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KVP_CU_RETURN_IF_ERROR(
      d->MemSetAccess(at, bytes, &access, 1),
      absl::StrCat("granting device ", access_device, " access to chunk ", handles_.size() - 1));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CudaArena::Granularity(int device) {
  RETURN_IF_ERROR(UseDevice(device));
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  const CUmemAllocationProp prop = Prop(device);
  size_t granularity = 0;
  KVP_CU_RETURN_IF_ERROR(
      d->MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      "reading the allocation granularity");
  return granularity;
}

absl::StatusOr<CudaArena> CudaArena::Create(int device, uint64_t chunk_bytes,
                                            uint64_t initial_bytes, uint64_t capacity_bytes) {
  ASSIGN_OR_RETURN(const uint64_t granularity, Granularity(device));
  if (chunk_bytes == 0 || chunk_bytes % granularity != 0 || capacity_bytes < initial_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("cuda arena: chunks of ", chunk_bytes,
                                                   " bytes must be a non-zero multiple of the ",
                                                   granularity, "-byte granularity, and capacity ",
                                                   capacity_bytes, " must cover ", initial_bytes));
  }
  CudaArena arena;
  arena.device_ = device;
  arena.chunk_bytes_ = chunk_bytes;
  const uint64_t chunks = (capacity_bytes + chunk_bytes - 1) / chunk_bytes;
  ASSIGN_OR_RETURN(arena.range_, CudaMappedRange::Reserve(chunks * chunk_bytes));
  RETURN_IF_ERROR(arena.GrowTo(initial_bytes));
  return arena;
}

absl::StatusOr<CudaArena> CudaArena::Adopt(int device, uint64_t chunk_bytes,
                                           std::vector<UniqueFd> fds) {
  if (fds.empty()) return absl::FailedPreconditionError("cuda arena: no chunks to adopt");
  RETURN_IF_ERROR(UseDevice(device));
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  CudaArena arena;
  arena.device_ = device;
  arena.chunk_bytes_ = chunk_bytes;
  ASSIGN_OR_RETURN(arena.range_, CudaMappedRange::Reserve(chunk_bytes * fds.size()));
  for (size_t i = 0; i < fds.size(); ++i) {
    ASSIGN_OR_RETURN(const CUmemGenericAllocationHandle handle, ImportChunk(d, fds[i], i));
    arena.adopted_fds_.push_back(std::move(fds[i]));
    CUmemAllocationProp prop{};
    if (const CUresult r = d->MemGetAllocationPropertiesFromHandle(&prop, handle);
        r != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop.location.id != device) {
      d->MemRelease(handle);
      return absl::FailedPreconditionError(
          absl::StrCat("cuda arena: chunk ", i, " is not memory of device ", device));
    }
    if (absl::Status s = arena.range_.Append(handle, chunk_bytes, device); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda arena: chunk ", i, " does not map as ", chunk_bytes, " bytes: ", s.message()));
    }
  }
  return arena;
}

absl::Status CudaArena::GrowTo(uint64_t bytes) {
  if (bytes > range_.capacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda arena: ", bytes, " bytes asked, capacity ", range_.capacity()));
  }
  RETURN_IF_ERROR(UseDevice(device_));
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  const CUmemAllocationProp prop = Prop(device_);
  while (range_.mapped_bytes() < bytes) {
    CUmemGenericAllocationHandle handle;
    const CUresult r = d->MemCreate(&handle, chunk_bytes_, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda arena: device ", device_, " has no room for chunk ", range_.handles().size()));
    }
    KVP_CU_RETURN_IF_ERROR(r, absl::StrCat("creating chunk ", range_.handles().size()));
    RETURN_IF_ERROR(range_.Append(handle, chunk_bytes_, device_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<UniqueFd>> CudaArena::ExportFds() const {
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  std::vector<UniqueFd> fds;
  for (size_t i = 0; i < range_.handles().size(); ++i) {
    if (i < adopted_fds_.size()) {
      UniqueFd dup = UniqueFd::Duplicate(adopted_fds_[i].get());
      if (!dup.valid()) return absl::InternalError(absl::StrCat("duplicating chunk ", i, "'s fd"));
      fds.push_back(std::move(dup));
      continue;
    }
    int fd = -1;
    KVP_CU_RETURN_IF_ERROR(
        d->MemExportToShareableHandle(&fd, range_.handles()[i],
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        absl::StrCat("exporting chunk ", i));
    fds.emplace_back(fd);
  }
  return fds;
}

absl::StatusOr<CudaArenaMapping> CudaArenaMapping::Map(int access_device,
                                                       const std::vector<uint64_t>& chunk_bytes,
                                                       std::vector<UniqueFd> fds) {
  if (chunk_bytes.size() != fds.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda arena: ", chunk_bytes.size(), " chunk sizes for ", fds.size(), " fds"));
  }
  RETURN_IF_ERROR(UseDevice(access_device));
  ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes) total += b;
  CudaArenaMapping m;
  ASSIGN_OR_RETURN(m.range_, CudaMappedRange::Reserve(total));
  for (size_t i = 0; i < fds.size(); ++i) {
    ASSIGN_OR_RETURN(const CUmemGenericAllocationHandle handle, ImportChunk(d, fds[i], i));
    RETURN_IF_ERROR(m.range_.Append(handle, chunk_bytes[i], access_device));
  }
  m.fds_ = std::move(fds);
  return m;
}

}  // namespace kvp
