// kvpool-bench broker: what kvpoold's Broker costs per decode step, without sockets: a batch of
// sequences forked from one long prompt, each step planned (appends, a job with block tables)
// and finished (a worker's report committed, the reply built), as bench-decode drives it.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct BrokerBenchConfig {
  int batch = 64;
  int context = 32768;
  int steps = 200;
};

struct BrokerBenchResult {
  BrokerBenchConfig config;
  double plan_us = 0;         // decode request in, job out (median)
  double finish_us = 0;       // worker report in, reply out, lengths only (median)
  double finish_last_us = 0;  // the same with the last layer's outputs (batch x 32 x 128 f32)
  size_t job_bytes = 0;       // of a step after the first (block tables sent as deltas)
};

absl::StatusOr<BrokerBenchResult> RunBrokerBench(const BrokerBenchConfig& config);
std::string BrokerTable(const BrokerBenchResult& r);
std::string BrokerJson(const BrokerBenchResult& r, const std::string& date,
                       const std::string& host);

}  // namespace kvp::bench
