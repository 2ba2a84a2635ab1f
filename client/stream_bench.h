// The streamed-prefill benchmark: how soon a long prompt prefilled on one pool can be decoded on
// another. Each run prefills a fresh prompt (no prefix hits anywhere) on --pool with --decode_pool
// set, in four ways: in one request written whole and moved after (chunkTokens 0); in one request
// in slices whose blocks move while the next slice is written; and as an engine's chunked prefill,
// one prefill per chunk with a pause between them (the engine computing the next), the last chunk
// moving the sequence, without and with `continued` (its blocks streaming during the pauses).
// kvpoold reports the time from the last write to the commit on the decode pool
// (MigrationReport.afterPrefillMicros); the client times the request that moves it (the only
// one, or the last chunk's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvp {

struct StreamBenchConfig {
  int context = 65536;        // prompt tokens
  int chunk_tokens = 8192;    // the sliced runs' slice
  int runs = 5;               // per mode
  int chunk_gap_ms = 10;      // the engine's pause between chunks
  int32_t pool = 0, decode_pool = 1;
};

struct StreamBenchMode {
  int32_t chunk_tokens = 0;      // 0: whole
  double request_ms = 0;         // median: the prefill request, reply included
  double decode_ready_ms = 0;    // median: the prefill's last write to the commit there
  double final_move_ms = 0;      // median: planning the final move to its commit
  uint32_t blocks_moved = 0, blocks_streamed = 0;  // of the last run
  uint64_t bytes = 0;
  wire::Transport transport = wire::Transport::NONE;
};

struct StreamBenchReport {
  StreamBenchConfig config;
  PoolSpec spec;
  int32_t pool_gpu = -1, decode_pool_gpu = -1;
  StreamBenchMode whole, sliced, chunks, chunks_streamed;
};

absl::StatusOr<StreamBenchReport> RunStreamBench(
    Client& client, const StreamBenchConfig& config,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress);

std::string StreamBenchTable(const StreamBenchReport& r);
std::string StreamBenchJson(const StreamBenchReport& r, const std::string& date,
                            const std::string& host, const std::string& device);

}  // namespace kvp
