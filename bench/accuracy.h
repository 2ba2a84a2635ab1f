// The accuracy benchmark: attention output error of quantized K/V formats against bf16 K/V on
// synthetic data with realistic, peaked attention (outlier K channels, needle queries).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/format/kv_format.h"

namespace kvp::bench {

struct AccuracyConfig {
  int num_seqs = 8;
  int context = 4096;
  int num_kv_heads = 8;
  int num_q_heads = 32;
  int head_dim = 128;
  uint64_t seed = 1;
};

struct AccuracyRow {
  KvFormat k_format;
  KvFormat v_format;
  int64_t bytes_per_token_head;  // K + V, all sections
  double compression_vs_bf16;    // bf16 bytes / these bytes
  double output_rel_l2;          // ‖o - o_bf16‖ / ‖o_bf16‖ over all outputs
  double output_rel_l2_p99;      // 99th percentile over (sequence, q head) outputs
  double min_cosine;             // worst cosine similarity of one output to bf16's
  double v_rel_mse;              // value reconstruction error Σ(v̂ - v)² / Σ v²
};

// fp8_e4m3 K + turbo3 V decoded with some operands of Q·Kᵀ and P·V rounded to E4M3, as FP8 tensor
// math would take them (bench/fp8_math_attention.h).
struct Fp8MathRow {
  std::string operands;         // "none", "Q", "P", "V" or "Q, P, V"
  double rel_l2_vs_float_math;  // against the reference's float math over the same cache
  double rel_l2_vs_bf16;        // against bf16 K/V, as output_rel_l2
};

// An MLA pool's fp8_ds_mla cache against bf16 latents (bench/mla_accuracy.h).
struct MlaAccuracy {
  int heads = 16;               // query heads (every one attends over the whole context)
  int bytes_per_token = 0;      // fp8_ds_mla: 656
  int bf16_bytes_per_token = 0; // 576 bf16 values: 1,152
  double output_rel_l2 = 0;     // ‖o - o_bf16‖ / ‖o_bf16‖ over all outputs
  double output_rel_l2_p99 = 0; // 99th percentile over (sequence, head) outputs
  double min_cosine = 1;        // worst cosine similarity of one output to bf16's
  double latent_rel_mse = 0;    // Σ(x̂ - x)² / Σ x² over the 512 latent values of every token
};

struct AccuracyReport {
  AccuracyConfig config;
  double mean_top_weight;  // average largest softmax weight: how peaked the attention is
  std::vector<AccuracyRow> rows;
  std::vector<Fp8MathRow> fp8_math;
  MlaAccuracy mla;
};

// Runs every K/V format pair through the reference dense decode, fp8_e4m3 + turbo3 through FP8
// tensor math, and an MLA pool's cache through sparse MLA decode. Prints progress to stderr.
absl::StatusOr<AccuracyReport> RunAccuracy(const AccuracyConfig& config);

std::string AccuracyTable(const AccuracyReport& report);
std::string AccuracyJson(const AccuracyReport& report, const std::string& date,
                         const std::string& host);

}  // namespace kvp::bench
