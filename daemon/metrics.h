// kvpoold's metrics (docs/design.md §9) and their Prometheus text form. The broker's loop updates
// them; the HTTP thread serves a rendered copy (daemon/http_endpoint.h), so nothing here is shared.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kvpool/pool/block_allocator.h"

namespace kvp {

// A cumulative histogram with fixed upper bounds, as Prometheus exposes it.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bound, not cumulative
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Job latency buckets: 100 µs to 30 s.
std::vector<double> JobLatencyBounds();

struct BrokerMetrics {
  std::map<std::string, uint64_t> requests;                      // by request kind
  std::map<std::string, uint64_t> errors;                        // replies by status code
  std::map<std::pair<std::string, std::string>, uint64_t> jobs;  // (kind, outcome)
  std::map<std::string, Histogram> job_seconds;                  // by kind, submit to reply
  uint64_t jobs_requeued = 0;
  uint64_t leases_reaped = 0;
  uint64_t prefix_hit_blocks = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefix_query_tokens = 0;               // tokens looked up in the prefix cache
  uint64_t rejected_nonfinite = 0;                // requests with NaN or Inf in their tensors
  mutable std::map<std::string, uint64_t> limit_refusals;  // by client limit (blocks, requests)
  std::map<std::pair<std::string, std::string>, uint64_t> migrations;  // (transport, outcome)
  std::map<std::string, uint64_t> migrated_bytes;                      // by transport
  std::map<std::string, Histogram> migration_seconds;                  // by transport
  uint64_t streamed_blocks = 0;  // moved while their prefill was written (sliced prefills)

  void ObserveJob(const std::string& kind, const std::string& outcome, double seconds);
  void ObserveMigration(const std::string& transport, bool ok, uint64_t bytes, double seconds);
};

// One pool now.
struct OnePoolGauges {
  int gpu = -1;  // -1: host arena
  PoolCounts blocks;
  uint64_t evicted = 0;  // cached blocks evicted since the start
  uint64_t sequences = 0;
  std::map<std::string, uint64_t> workers;  // by role
};

// What the pools look like now: gauges read at render time.
struct PoolGauges {
  std::vector<OnePoolGauges> pools;  // by pool index
  uint64_t leases = 0;
  uint64_t jobs_queued = 0;
  uint64_t jobs_running = 0;
  bool draining = false;
  // The settings the kernels run with, per layer, and the per-client limits.
  std::vector<float> k_scales, v_scales;  // one per layer
  std::vector<int> sliding_windows;       // one per layer; 0: none
  float sparse_v_threshold = 0;
  int64_t client_max_blocks = 0;
  int client_max_requests = 0;
  // What the last start recovered from the state log (docs/design.md §10).
  uint64_t recovered_sequences = 0, recovered_blocks = 0, recovery_micros = 0;
};

std::string RenderPrometheus(const BrokerMetrics& metrics, const PoolGauges& gauges);

}  // namespace kvp
