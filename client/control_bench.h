// The control-plane benchmark: round trips kvpoold answers itself (an engine's Append of one
// block's tokens to a fresh sequence, then its Commit), next to a bare ZeroMQ DEALER/ROUTER echo
// of a message of the same size over ipc://, served by another process as kvpoold is, measured in
// the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvp {

struct LatencySummary {
  double p50_us = 0, p99_us = 0, mean_us = 0;
  double per_second = 0;
};

struct ControlBenchReport {
  int requests = 0;
  size_t message_bytes = 0;  // the append request as framed
  LatencySummary bare;       // ZeroMQ echo round trip
  LatencySummary append;     // reserve one block
  LatencySummary commit;     // commit it
};

// `requests` append + commit pairs (each sequence is released afterwards, untimed).
absl::StatusOr<ControlBenchReport> RunControlBench(
    Client& client, int requests, const std::function<void(int64_t, int64_t)>& progress);

std::string ControlBenchTable(const ControlBenchReport& r);
std::string ControlBenchJson(const ControlBenchReport& r, const std::string& date,
                             const std::string& host);

}  // namespace kvp
