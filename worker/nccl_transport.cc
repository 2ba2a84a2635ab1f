#include "worker/nccl_transport.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda_ops.h"
#include "kernels/common/cuda_status.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReceiverRank = 1, kSenderRank = 0;
constexpr size_t kMaxLinks = 16;  // communicators kept; the oldest links are aborted past it

bool Sending(const MigrateWork& work) { return work.link->side == wire::TransferSide::SEND; }

}  // namespace

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(OwnArena arena) {
  ASSIGN_OR_RETURN(const NcclLibrary* nccl, LoadNccl());
  std::unique_ptr<NcclTransport> t(new NcclTransport(nccl, arena));
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena.device));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t->stream_, cudaStreamNonBlocking));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&t->pack_stream_, cudaStreamNonBlocking));
  for (int slot = 0; slot < 2; ++slot) {
    KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t->packed_[slot], cudaEventDisableTiming));
    KVP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t->moved_[slot], cudaEventDisableTiming));
  }
  spdlog::info("NCCL {} loaded from {}", nccl->version, nccl->path);
  return t;
}

NcclTransport::~NcclTransport() {
  for (auto& [link, comm] : comms_) nccl_->CommAbort(comm);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (pack_stream_ != nullptr) cudaStreamSynchronize(pack_stream_);
  for (int slot = 0; slot < 2; ++slot) {
    if (packed_[slot] != nullptr) cudaEventDestroy(packed_[slot]);
    if (moved_[slot] != nullptr) cudaEventDestroy(moved_[slot]);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (pack_stream_ != nullptr) cudaStreamDestroy(pack_stream_);
}

void NcclTransport::Forget(uint64_t link) {
  if (auto it = comms_.find(link); it != comms_.end()) {
    nccl_->CommAbort(it->second);
    comms_.erase(it);
  }
}

absl::StatusOr<std::string> NcclTransport::Open(const MigrateWork& work) {
  ncclUniqueId id;
  if (const ncclResult_t r = nccl_->GetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", nccl_->Describe(r, nullptr)));
  }
  opened_.emplace(work.link->id, id);
  return std::string(id.internal, sizeof(id.internal));
}

absl::Status NcclTransport::Settle(ncclResult_t result, ncclComm_t comm, const MigrateWork& work,
                                   const char* what) {
  while (result == ncclInProgress) {
    if (Clock::now() > work.link->deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("link ", work.link->id, ": the deadline passed in ", what));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (nccl_->CommGetAsyncError(comm, &result) != ncclSuccess) break;
  }
  if (result != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("link ", work.link->id, ": ", what, ": ", nccl_->Describe(result, comm)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ncclComm_t> NcclTransport::CommFor(const MigrateWork& work) {
  const LinkWork& link = *work.link;
  if (!link.fresh) {
    if (auto it = comms_.find(link.id); it != comms_.end()) return it->second;
    return absl::FailedPreconditionError(
        absl::StrCat("link ", link.id, " has no communicator here (this worker restarted?)"));
  }
  Forget(link.id);
  ncclUniqueId id;
  int rank = kSenderRank;
  if (Sending(work)) {
    if (link.rendezvous.size() != sizeof(id.internal)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the rendezvous of link ", link.id, " has ", link.rendezvous.size(),
          " bytes; an ncclUniqueId has ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, link.rendezvous.data(), sizeof(id.internal));
  } else {
    if (!opened_.has_value() || opened_->first != link.id) {
      return absl::FailedPreconditionError(absl::StrCat("link ", link.id, " was not opened here"));
    }
    id = opened_->second;
    opened_.reset();
    rank = kReceiverRank;
  }
  while (comms_.size() >= kMaxLinks) Forget(comms_.begin()->first);
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena_.device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = nccl_->CommInitRankConfig(&comm, 2, id, rank, &config);
  if (comm == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ncclCommInitRankConfig: ", nccl_->Describe(r, nullptr)));
  }
  if (absl::Status s = Settle(r, comm, work, "ncclCommInitRankConfig"); !s.ok()) {
    nccl_->CommAbort(comm);
    return s;
  }
  comms_[link.id] = comm;
  spdlog::info("link {}: NCCL communicator up, rank {} of 2 on GPU {} (NCCL_DEBUG=INFO logs the "
               "transport it chose)", link.id, rank, arena_.device);
  return comm;
}

absl::Status NcclTransport::Receive(const MigrateWork& work) { return Move(work); }
absl::Status NcclTransport::Send(const MigrateWork& work) { return Move(work); }

absl::Status NcclTransport::Move(const MigrateWork& work) {
  KVP_CUDA_RETURN_IF_ERROR(cudaSetDevice(arena_.device));
  absl::StatusOr<ncclComm_t> comm = CommFor(work);
  if (!comm.ok()) return comm.status();
  const bool direct = CoalesceRuns(work.moves).size() <= kMaxDirectRuns;
  absl::Status moved = direct ? MoveDirect(work, *comm) : MoveStaged(work, *comm);
  if (moved.ok()) moved = Drain(*comm, work);
  if (!moved.ok()) Forget(work.link->id);  // the peer may be half-way: this link is done
  return moved;
}

absl::Status NcclTransport::MoveDirect(const MigrateWork& work, ncclComm_t comm) {
  const std::vector<MovePiece> pieces =
      PiecesOf(work.moves, arena_.block_stride, work.link->source_chunk_bytes,
               work.link->target_chunk_bytes);
  RETURN_IF_ERROR(Settle(nccl_->GroupStart(), comm, work, "ncclGroupStart"));
  ncclResult_t r = ncclSuccess;
  for (const MovePiece& p : pieces) {
    r = Sending(work) ? nccl_->Send(arena_.base + p.source_offset, p.bytes, ncclUint8,
                                    kReceiverRank, comm, stream_)
                      : nccl_->Recv(arena_.base + p.target_offset, p.bytes, ncclUint8,
                                    kSenderRank, comm, stream_);
    if (r != ncclSuccess && r != ncclInProgress) break;
  }
  const ncclResult_t end = nccl_->GroupEnd();
  RETURN_IF_ERROR(Settle(r != ncclSuccess && r != ncclInProgress ? r : end, comm, work,
                         Sending(work) ? "ncclSend" : "ncclRecv"));
  return absl::OkStatus();
}

absl::Status NcclTransport::MoveStaged(const MigrateWork& work, ncclComm_t comm) {
  const uint64_t stride = static_cast<uint64_t>(arena_.block_stride);
  const int64_t slot_blocks = static_cast<int64_t>(std::max<uint64_t>(1, kSlotBytes / stride));
  if (staging_.bytes() < 2 * slot_blocks * stride) {
    ASSIGN_OR_RETURN(staging_, DeviceBuffer::Allocate(2 * slot_blocks * stride));
  }
  // This side's block ids, in move order: what the kernels pack from or unpack into.
  std::vector<int32_t> ids;
  for (const auto& [source, target] : work.moves) ids.push_back(Sending(work) ? source : target);
  DeviceBuffer& device_ids = Sending(work) ? source_ids_ : target_ids_;
  if (device_ids.bytes() < ids.size() * sizeof(int32_t)) {
    ASSIGN_OR_RETURN(device_ids, DeviceBuffer::Allocate(ids.size() * sizeof(int32_t)));
  }
  KVP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_ids.get(), ids.data(),
                                           ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                           pack_stream_));
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t first = 0, chunk = 0; first < n; first += slot_blocks, ++chunk) {
    const int slot = static_cast<int>(chunk % 2);
    BlockCopyParams p{.arena = arena_.base, .num_arena_blocks = arena_.num_blocks,
                      .block_stride = arena_.block_stride,
                      .block_ids = device_ids.get<int32_t>() + first,
                      .num_blocks = static_cast<int32_t>(std::min(slot_blocks, n - first)),
                      .staging = staging_.get<uint8_t>() + slot * slot_blocks * stride};
    const size_t bytes = static_cast<size_t>(p.num_blocks) * stride;
    if (Sending(work)) {
      // Pack once the slot's last send is done, then send once packed.
      if (chunk >= 2) KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(pack_stream_, moved_[slot]));
      RETURN_IF_ERROR(GatherBlocksCuda(p, pack_stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(packed_[slot], pack_stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, packed_[slot]));
      RETURN_IF_ERROR(Settle(nccl_->Send(p.staging, bytes, ncclUint8, kReceiverRank, comm,
                                         stream_), comm, work, "ncclSend"));
      KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(moved_[slot], stream_));
    } else {
      // Receive once the slot's last unpack is done, then unpack once received.
      if (chunk >= 2) KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, moved_[slot]));
      RETURN_IF_ERROR(Settle(nccl_->Recv(p.staging, bytes, ncclUint8, kSenderRank, comm,
                                         stream_), comm, work, "ncclRecv"));
      KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(packed_[slot], stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(pack_stream_, packed_[slot]));
      RETURN_IF_ERROR(ScatterBlocksCuda(p, pack_stream_));
      KVP_CUDA_RETURN_IF_ERROR(cudaEventRecord(moved_[slot], pack_stream_));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Drain(ncclComm_t comm, const MigrateWork& work) {
  for (;;) {
    ncclResult_t async = ncclSuccess;
    nccl_->CommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      return absl::UnavailableError(absl::StrCat("link ", work.link->id, ": ",
                                                 nccl_->Describe(async, comm)));
    }
    const cudaError_t a = cudaStreamQuery(stream_), b = cudaStreamQuery(pack_stream_);
    if (a == cudaSuccess && b == cudaSuccess) return absl::OkStatus();
    if (a != cudaErrorNotReady && a != cudaSuccess) return CudaStatus(a, "the NCCL stream");
    if (b != cudaErrorNotReady && b != cudaSuccess) return CudaStatus(b, "the packing stream");
    if (Clock::now() > work.link->deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "link ", work.link->id, ": the deadline passed with the move still in flight"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

}  // namespace kvp
