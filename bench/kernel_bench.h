// kvpool-bench kernels: times every CUDA kernel on the GPU (CUDA events, warm-up, median of many
// runs, inputs larger than L2 or rotated across copies, synthetic non-zero data) and reports bytes
// moved, GB/s and the fraction of the GPU's device-to-device copy bandwidth measured in the same
// run.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvp::bench {

struct KernelRow {
  std::string op;     // "paged_decode", "topk", ...
  std::string shape;  // "batch=32 ctx=8192 q/kv=32/8 d=128 turbo3"
  double median_us = 0.0;
  double bytes = 0.0;  // bytes the kernel must move (reads + writes); 0 for empty launches
  std::vector<std::pair<std::string, double>> extra;
};

struct KernelReport {
  std::string device;
  double copy_tbps = 0.0;  // device-to-device copy, read + write bytes per second / 1e12
  std::vector<KernelRow> rows;
};

// The groups of measurements, in the order they run.
inline constexpr const char* kKernelBenchSections[] = {
    "dense", "shapes", "sparse_v", "layer", "batched", "cache_write", "block_copy", "launch", "mla"};

struct KernelBenchOptions {
  bool quick = false;             // shrinks the shapes for a smoke run
  std::vector<std::string> only;  // sections to run (kKernelBenchSections); empty = all
};

// Fails with INVALID_ARGUMENT for a section name it does not know.
absl::StatusOr<KernelReport> RunKernelBench(const KernelBenchOptions& options);

std::string KernelJson(const KernelReport& report, const std::string& date);
// One line on stderr: what the bench measures now.
void KernelBenchProgress(const std::string& what);
std::string KernelTable(const KernelReport& report);

}  // namespace kvp::bench
