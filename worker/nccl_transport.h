// The nccl transport of paired moves between cuda pools (docs/design.md §6): one communicator of
// two ranks per link (receiver rank 1, sender rank 0), bootstrapped from the ncclUniqueId the
// receiver makes and kvpoold relays, kept for the link's later moves. Communicators are
// non-blocking and every wait runs against the link's deadline; on a timeout or an error the
// communicator is aborted and forgotten (kvpoold opens a fresh link next time).
//
// A table of few runs goes as one ncclSend/ncclRecv per piece (worker/migration.h: runs cut at
// chunk boundaries), grouped. A fragmented one is packed by the gather kernel into one of two
// staging slots, sent, received into a slot and unpacked by the scatter kernel: packing, sending
// and unpacking of consecutive slots overlap on two streams.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kernels/common/device_buffer.h"
#include "worker/nccl_library.h"
#include "worker/paired_move.h"

namespace kvp {

class NcclTransport : public PairedTransport {
 public:
  // UNIMPLEMENTED without NCCL (nccl_library.h); INTERNAL for a CUDA failure.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(OwnArena arena);
  ~NcclTransport() override;  // aborts the communicators: their peers may be gone

  absl::StatusOr<std::string> Open(const MigrateWork& work) override;
  absl::Status Receive(const MigrateWork& work) override;
  absl::Status Send(const MigrateWork& work) override;

  // More runs than this make a table fragmented: staged through the gather/scatter kernels.
  static constexpr size_t kMaxDirectRuns = 8;
  // Each of the two staging slots holds this many bytes of whole blocks (at least one block).
  static constexpr uint64_t kSlotBytes = uint64_t{32} << 20;

 private:
  NcclTransport(const NcclLibrary* nccl, OwnArena arena) : nccl_(nccl), arena_(arena) {}
  // The link's communicator: initialised for a fresh link (rank 1 from Open's id, rank 0 from the
  // rendezvous), found for a known one. FAILED_PRECONDITION for a link this worker does not hold.
  absl::StatusOr<ncclComm_t> CommFor(const MigrateWork& work);
  // Either side's move: the communicator, the pieces or slots, then the drain.
  absl::Status Move(const MigrateWork& work);
  absl::Status MoveDirect(const MigrateWork& work, ncclComm_t comm);
  absl::Status MoveStaged(const MigrateWork& work, ncclComm_t comm);
  // Waits for a call's enqueueing on a non-blocking communicator (ncclInProgress) to settle.
  absl::Status Settle(ncclResult_t result, ncclComm_t comm, const MigrateWork& work,
                      const char* what);
  // Waits until both streams have drained, polling the communicator for errors.
  absl::Status Drain(ncclComm_t comm, const MigrateWork& work);
  void Forget(uint64_t link);  // aborts and drops its communicator

  const NcclLibrary* nccl_;
  OwnArena arena_;
  cudaStream_t stream_ = nullptr;  // NCCL's
  cudaStream_t pack_stream_ = nullptr;
  cudaEvent_t packed_[2] = {}, moved_[2] = {};  // per slot: filled, emptied
  DeviceBuffer staging_, source_ids_, target_ids_;
  absl::flat_hash_map<uint64_t, ncclComm_t> comms_;     // by link id
  std::optional<std::pair<uint64_t, ncclUniqueId>> opened_;  // Open's id, until its Receive
};

}  // namespace kvp
