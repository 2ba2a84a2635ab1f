// kvpool-bench: the project's benchmarks. Each subcommand prints a table and can write JSON for
// bench/results/.
//
//   kvpool-bench accuracy [--seqs=N] [--context=T] [--json=PATH]
//   kvpool-bench kernels [--quick] [--json=PATH]     (CUDA builds, on a GPU)
//   kvpool-bench pool [--json=PATH]
//   kvpool-bench attach [--gib=N] [--chunk-gib=C] [--json=PATH]   (CUDA builds, on a GPU)
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/types/span.h"
#include "bench/accuracy.h"
#include "bench/pool_bench.h"
#if defined(KVP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "bench/attach_bench.h"
#include "bench/kernel_bench.h"
#endif
#include "tools/file_io.h"

namespace {

constexpr char kUsage[] =
    "usage: kvpool-bench accuracy [--seqs=N] [--context=T] [--seed=S] [--json=PATH]\n"
    "       kvpool-bench kernels [--quick] [--json=PATH]\n"
    "       kvpool-bench pool [--json=PATH]\n"
    "       kvpool-bench attach [--gib=64] [--chunk-gib=1] [--json=PATH]\n"
    "\n"
    "  accuracy  attention output error of fp8_e4m3 K and TurboNV V against bf16 K/V on\n"
    "            synthetic data with peaked attention (CPU reference kernels)\n"
    "  kernels   every CUDA kernel timed on the GPU: median time, bytes, TB/s and the fraction\n"
    "            of the device-to-device copy bandwidth measured in the same run\n"
    "  pool      block operations per second of the pool's bookkeeping on one core\n"
    "  attach    time another process takes to attach a cuda arena of N GiB\n";

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

std::string Hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

int WriteJson(const std::string& path, const std::string& json) {
  const auto status = kvp::WriteFileAtomically(
      path, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  if (!status.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return 0;
}

int Kernels(absl::Span<char* const> args) {
#if defined(KVP_HAVE_CUDA)
  bool quick = false;
  std::string json_path;
  for (const char* raw : args) {
    const absl::string_view arg = raw;
    if (arg == "--quick") {
      quick = true;
    } else if (absl::StartsWith(arg, "--json=")) {
      json_path = std::string(arg.substr(7));
    } else {
      std::fprintf(stderr, "kvpool-bench: bad argument '%s'\n\n%s", raw, kUsage);
      return 2;
    }
  }
  const auto report = kvp::bench::RunKernelBench(quick);
  if (!report.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::fputs(kvp::bench::KernelTable(*report).c_str(), stdout);
  return json_path.empty() ? 0 : WriteJson(json_path, kvp::bench::KernelJson(*report, Today()));
#else
  (void)args;
  std::fprintf(stderr, "kvpool-bench: this build has no CUDA kernels (nvcc was not found)\n");
  return 1;
#endif
}

int Attach(const char* self, absl::Span<char* const> args) {
#if defined(KVP_HAVE_CUDA)
  double gib = 64, chunk_gib = 1;
  std::string json_path;
  for (const char* raw : args) {
    const absl::string_view arg = raw;
    bool ok = true;
    if (absl::StartsWith(arg, "--gib=")) {
      ok = absl::SimpleAtod(arg.substr(6), &gib) && gib > 0;
    } else if (absl::StartsWith(arg, "--chunk-gib=")) {
      ok = absl::SimpleAtod(arg.substr(12), &chunk_gib) && chunk_gib > 0;
    } else if (absl::StartsWith(arg, "--json=")) {
      json_path = std::string(arg.substr(7));
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "kvpool-bench: bad argument '%s'\n\n%s", raw, kUsage);
      return 2;
    }
  }
  const auto r = kvp::bench::RunAttachBench(self, gib, chunk_gib);
  if (!r.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("| cuda arena | chunks | create (kvpoold) | attach (other process) | connect to mapped | its CUDA context |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: |\n| %.0f GiB | %d x %.2f GiB | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n",
              r->arena_gib, r->chunks, r->chunk_gib, r->create_ms, r->attach_ms, r->connect_to_mapped_ms,
              r->context_ms);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  return json_path.empty() ? 0 : WriteJson(json_path, kvp::bench::AttachJson(*r, Today(), prop.name));
#else
  (void)self;
  (void)args;
  std::fprintf(stderr, "kvpool-bench: this build has no CUDA (nvcc was not found)\n");
  return 1;
#endif
}

int Pool(absl::Span<char* const> args) {
  std::string json_path;
  for (const char* raw : args) {
    const absl::string_view arg = raw;
    if (!absl::StartsWith(arg, "--json=")) {
      std::fprintf(stderr, "kvpool-bench: bad argument '%s'\n\n%s", raw, kUsage);
      return 2;
    }
    json_path = std::string(arg.substr(7));
  }
  const kvp::bench::PoolBenchResult r = kvp::bench::RunPoolBench();
  std::fputs(kvp::bench::PoolTable(r).c_str(), stdout);
  return json_path.empty() ? 0 : WriteJson(json_path, kvp::bench::PoolJson(r, Today(), Hostname()));
}

int Accuracy(absl::Span<char* const> args) {
  kvp::bench::AccuracyConfig config;
  std::string json_path;
  for (const char* raw : args) {
    const absl::string_view arg = raw;
    bool ok = true;
    if (absl::StartsWith(arg, "--seqs=")) {
      ok = absl::SimpleAtoi(arg.substr(7), &config.num_seqs) && config.num_seqs > 0;
    } else if (absl::StartsWith(arg, "--context=")) {
      ok = absl::SimpleAtoi(arg.substr(10), &config.context) && config.context > 0;
    } else if (absl::StartsWith(arg, "--seed=")) {
      ok = absl::SimpleAtoi(arg.substr(7), &config.seed);
    } else if (absl::StartsWith(arg, "--json=")) {
      json_path = std::string(arg.substr(7));
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "kvpool-bench: bad argument '%s'\n\n%s", raw, kUsage);
      return 2;
    }
  }
  const auto report = kvp::bench::RunAccuracy(config);
  if (!report.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::fputs(kvp::bench::AccuracyTable(*report).c_str(), stdout);
  if (json_path.empty()) return 0;
  return WriteJson(json_path, kvp::bench::AccuracyJson(*report, Today(), Hostname()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "accuracy") == 0) {
    return Accuracy(absl::MakeConstSpan(argv + 2, argc - 2));
  }
#if defined(KVP_HAVE_CUDA)
  if (argc == 3 && std::strcmp(argv[1], "attach-child") == 0) return kvp::bench::AttachChild(argv[2]);
#endif
  if (argc >= 2 && std::strcmp(argv[1], "attach") == 0) {
    return Attach(argv[0], absl::MakeConstSpan(argv + 2, argc - 2));
  }
  if (argc >= 2 && std::strcmp(argv[1], "pool") == 0) {
    return Pool(absl::MakeConstSpan(argv + 2, argc - 2));
  }
  if (argc >= 2 && std::strcmp(argv[1], "kernels") == 0) {
    return Kernels(absl::MakeConstSpan(argv + 2, argc - 2));
  }
  const bool help = argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  std::fputs(kUsage, help ? stdout : stderr);
  return help ? 0 : 2;
}
