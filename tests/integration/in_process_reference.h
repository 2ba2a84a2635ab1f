// The synthetic workload run in one process: a local host arena and Pool, the host executor, the
// same jobs kvpoold would send. The service's outputs must equal these bit for bit.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "client/workload.h"
#include "protocol/outputs_codec.h"

namespace kvp::testing {

// Per decode step, the outputs of every sequence in order.
absl::StatusOr<std::vector<std::vector<DecodeStepResult>>> RunWorkloadInProcess(
    const WorkloadConfig& config, const PoolSpec& spec, const ModelConfig& model);

}  // namespace kvp::testing
