// The service decode benchmark: decode steps of a large batch through the whole service (client ->
// kvpoold -> decode worker -> kernels for every layer -> client), next to the worker's own time
// for the same step (the executor call a direct user of the kernels would make), in the same run.
// The batch shares one long prompt through forks, so a real model's context fits in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvp {

struct DecodeBenchConfig {
  int batch = 64;
  int context = 32768;
  int steps = 20;   // timed
  int warmup = 3;   // not timed
  wire::OutputLayers outputs = wire::OutputLayers::LAST;
  std::string placement = "default";  // how the processes sat on CPUs: recorded, not acted on
  std::optional<PoolKind> pool_kind;  // the kind kvpoold must serve; none: whatever it serves
};

struct DecodeBenchReport {
  DecodeBenchConfig config;
  PoolSpec spec;
  ModelConfig model;
  double prefill_seconds = 0;
  double e2e_p50_ms = 0, e2e_mean_ms = 0, e2e_p99_ms = 0;  // client round trip per step
  double worker_p50_ms = 0, worker_mean_ms = 0;            // the executor's time per step
  // Where the rest goes (means): the worker around the executor (decoding the job, encoding the
  // outputs), kvpoold's handlers, and what is left: transport and wake-ups between processes.
  double worker_handling_ms = 0, broker_ms = 0, transport_ms = 0;
  double overhead_fraction() const { return e2e_p50_ms / worker_p50_ms - 1.0; }
};

absl::StatusOr<DecodeBenchReport> RunDecodeBench(
    Client& client, const DecodeBenchConfig& config,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress);

std::string DecodeBenchTable(const DecodeBenchReport& r);
std::string DecodeBenchJson(const DecodeBenchReport& r, const std::string& date,
                            const std::string& host, const std::string& device);

}  // namespace kvp
