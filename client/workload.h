// The synthetic workload (the README's main job and kvpoolctl bench): prefill many sequences, then
// decode them step by step in one batch, with a needle planted in every step's queries. It reports
// throughput, cache bytes per token against bf16, the attention error against a bf16 reference
// over the same selected positions, and how often the indexer's top-k found the needle.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace kvp {

struct WorkloadConfig {
  int sequences = 16;
  int prompt_tokens = 2048;
  int decode_steps = 64;
  int shared_prefix_tokens = 0;  // leading prompt tokens all sequences share: prefix hits
  float needle_gain = 0.35f;
  uint64_t seed = 1;
  int verify_sequences = 4;      // sequences checked against the bf16 reference (0: none)
  wire::OutputLayers outputs = wire::OutputLayers::ALL;  // what replies carry
  bool release = true;           // release the sequences at the end
  uint64_t first_sequence = 1;   // sequence ids first_sequence, first_sequence + 1, ...
};

struct WorkloadReport {
  WorkloadConfig config;
  PoolSpec spec;
  ModelConfig model;
  int64_t prefill_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_tokens = 0;
  double decode_seconds = 0;
  double step_p50_ms = 0, step_p99_ms = 0;  // one batched decode request, client-side
  double worker_ms_mean = 0;                // the decode worker's time per step
  double cache_bytes_per_token = 0;         // all layers, K + V (+ indexer) with their scales
  double bf16_bytes_per_token = 0;          // the same tokens as bf16 K/V (+ bf16 index keys)
  int64_t verified_outputs = 0;             // (step, layer, q head) outputs checked
  double attention_rel_l2 = 0;              // ‖o - o_bf16‖ / ‖o_bf16‖ over all of them
  double attention_max_abs = 0;
  int64_t needles = 0, needles_found = 0;   // (step, layer) pairs; pools with an indexer
};

// Called as work completes: phase ("prefill", "decode"), done, total.
using ProgressFn = std::function<void(const std::string&, int64_t, int64_t)>;

// Runs the workload through `client`. `outputs`, when given, receives every decode reply in step
// order (for comparisons).
absl::StatusOr<WorkloadReport> RunWorkload(Client& client, const WorkloadConfig& config,
                                           const ProgressFn& progress,
                                           std::vector<DecodeResult>* outputs = nullptr);

// The workload's token ids: prompts (sharing the first shared_prefix_tokens), decode tokens and
// needle positions, the same for every run with the same config.
std::vector<int32_t> WorkloadPrompt(const WorkloadConfig& config, int sequence_index);
int32_t WorkloadDecodeToken(const WorkloadConfig& config, int sequence_index, int step);
int64_t WorkloadNeedlePosition(const WorkloadConfig& config, int sequence_index, int step,
                               int64_t length);

std::string WorkloadTable(const WorkloadReport& report);
std::string WorkloadJson(const WorkloadReport& report, const std::string& date,
                         const std::string& host, const std::string& device);

}  // namespace kvp
