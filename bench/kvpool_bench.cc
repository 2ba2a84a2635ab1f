// kvpool-bench: the project's benchmarks. Each subcommand prints a table and can write JSON for
// bench/results/.
//
//   kvpool-bench accuracy [--seqs=N] [--context=T] [--seed=S] [--json=PATH]
//   kvpool-bench pool [--json=PATH]
//   kvpool-bench broker [--json=PATH]
//   kvpool-bench kernels [--quick] [--only=S,...] [--json=PATH] (CUDA builds, on a GPU)
//   kvpool-bench attach [--gib=N] [--chunk-gib=C] [--json=PATH]  (CUDA builds, on a GPU)
//   kvpool-bench migrate [--source_gpu=0] [--target_gpu=0] [--json=PATH]  (CUDA builds)
//   kvpool-bench recovery [--sequences=N] [--arena_gib=G] [--cuda] [--json=PATH]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "base/run_info.h"
#include "bench/accuracy.h"
#include "bench/broker_bench.h"
#include "bench/pool_bench.h"
#include "bench/recovery_bench.h"
#include "tools/file_io.h"
#if defined(KVP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "bench/attach_bench.h"
#include "bench/kernel_bench.h"
#include "bench/migrate_bench.h"
#include "kvpool/arena/cuda_arena.h"
#endif

namespace {

constexpr char kUsage[] =
    "usage: kvpool-bench accuracy [--seqs=N] [--context=T] [--seed=S] [--json=PATH]\n"
    "       kvpool-bench pool [--json=PATH]\n"
    "       kvpool-bench broker [--json=PATH]\n"
    "       kvpool-bench recovery [--sequences=100000] [--arena_gib=64] [--cuda] [--json=PATH]\n"
    "       kvpool-bench kernels [--quick] [--only=SECTION,...] [--json=PATH]\n"
    "       kvpool-bench attach [--gib=64] [--chunk-gib=1] [--json=PATH]\n"
    "       kvpool-bench migrate [--source_gpu=0] [--target_gpu=0] [--json=PATH]\n"
    "\n"
    "  accuracy  attention output error of fp8_e4m3 K and TurboNV V against bf16 K/V on\n"
    "            synthetic data with peaked attention (CPU reference kernels)\n"
    "  pool      block operations per second of the pool's bookkeeping on one core\n"
    "  broker    kvpoold's own time per decode step (batch 64, 32k context), no sockets\n"
    "  recovery  a restart's replay of the state log and restore of the pools (--cuda: and the\n"
    "            adoption of a cuda arena's chunks from fds whose creator is gone)\n"
    "  kernels   every CUDA kernel timed on the GPU: median time, bytes, TB/s and the fraction\n"
    "            of the device-to-device copy bandwidth measured in the same run; --only picks\n"
    "            sections: dense, shapes, sparse_v, layer, batched, cache_write, block_copy,\n"
    "            launch (shapes: dense decode at other heads, head dims, blocks, V formats)\n"
    "  attach    time another process takes to attach a cuda arena of N GiB\n"
    "  migrate   a migration's copy between two pools' cuda arenas through the worker's code\n"
    "            (1 GiB contiguous and fragmented, a 64 MiB sequence) beside cudaMemcpy(Peer)\n";

// --name=value and --name (value "") arguments of one subcommand.
class Flags {
 public:
  static absl::StatusOr<Flags> Parse(absl::Span<char* const> args,
                                     std::initializer_list<absl::string_view> known) {
    Flags f;
    for (const char* raw : args) {
      absl::string_view arg = raw;
      if (!absl::ConsumePrefix(&arg, "--")) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", raw, "'"));
      }
      std::pair<std::string, std::string> kv = absl::StrSplit(arg, absl::MaxSplits('=', 1));
      if (std::find(known.begin(), known.end(), kv.first) == known.end()) {
        return absl::InvalidArgumentError(absl::StrCat("unknown option '", raw, "'"));
      }
      f.values_[kv.first] = kv.second;
    }
    return f;
  }
  bool Has(const std::string& name) const { return values_.contains(name); }
  std::string String(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? "" : it->second;
  }
  // Leaves *out alone when the flag is absent; false when it does not parse or is not positive.
  template <typename T>
  bool Positive(const std::string& name, T* out) const {
    if (!Has(name)) return true;
    T v;
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtod(String(name), &v);
    } else {
      ok = absl::SimpleAtoi(String(name), &v);
    }
    if (!ok || !(v > 0)) return false;
    *out = v;
    return true;
  }

 private:
  absl::flat_hash_map<std::string, std::string> values_;
};

int Usage(const std::string& why) {
  std::fprintf(stderr, "kvpool-bench: %s\n\n%s", why.c_str(), kUsage);
  return 2;
}

// Prints the table of a finished benchmark and writes its JSON when --json was given.
template <typename Report>
int Finish(const absl::StatusOr<Report>& report, const Flags& flags,
           const std::function<std::string(const Report&)>& table,
           const std::function<std::string(const Report&)>& json) {
  if (!report.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::fputs(table(*report).c_str(), stdout);
  const std::string path = flags.String("json");
  if (path.empty()) return 0;
  const std::string text = json(*report);
  const auto status = kvp::WriteFileAtomically(
      path, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  if (!status.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", path.c_str());
  return 0;
}

int Accuracy(const Flags& flags) {
  kvp::bench::AccuracyConfig config;
  if (!flags.Positive("seqs", &config.num_seqs) || !flags.Positive("context", &config.context) ||
      !flags.Positive("seed", &config.seed)) {
    return Usage("--seqs, --context and --seed take positive integers");
  }
  using Report = kvp::bench::AccuracyReport;
  return Finish<Report>(kvp::bench::RunAccuracy(config), flags, kvp::bench::AccuracyTable,
                        [](const Report& r) {
                          return kvp::bench::AccuracyJson(r, kvp::TodayUtc(), kvp::Hostname());
                        });
}

int Pool(const Flags& flags) {
  using Report = kvp::bench::PoolBenchResult;
  return Finish<Report>(
      kvp::bench::RunPoolBench(), flags, kvp::bench::PoolTable,
      [](const Report& r) { return kvp::bench::PoolJson(r, kvp::TodayUtc(), kvp::Hostname()); });
}

int Recovery(const Flags& flags) {
  kvp::bench::RecoveryBenchOptions options;
  double gib = 64;
  if (!flags.Positive("sequences", &options.sequences) || !flags.Positive("arena_gib", &gib)) {
    return Usage("--sequences and --arena_gib take positive numbers");
  }
  options.arena_bytes = static_cast<uint64_t>(gib * double(uint64_t{1} << 30));
  options.cuda = flags.Has("cuda");
  using Report = kvp::bench::RecoveryReport;
  return Finish<Report>(kvp::bench::RunRecoveryBench(options), flags, kvp::bench::RecoveryTable,
                        [](const Report& r) { return kvp::bench::RecoveryJson(r, kvp::TodayUtc()); });
}

int Broker(const Flags& flags) {
  using Report = kvp::bench::BrokerBenchResult;
  return Finish<Report>(
      kvp::bench::RunBrokerBench({}), flags, kvp::bench::BrokerTable,
      [](const Report& r) { return kvp::bench::BrokerJson(r, kvp::TodayUtc(), kvp::Hostname()); });
}

#if defined(KVP_HAVE_CUDA)
int Kernels(const Flags& flags) {
  using Report = kvp::bench::KernelReport;
  kvp::bench::KernelBenchOptions options;
  options.quick = flags.Has("quick");
  if (flags.Has("only")) options.only = absl::StrSplit(flags.String("only"), ',');
  return Finish<Report>(kvp::bench::RunKernelBench(options), flags, kvp::bench::KernelTable,
                        [](const Report& r) { return kvp::bench::KernelJson(r, kvp::TodayUtc()); });
}

int Attach(const char* self, const Flags& flags) {
  double gib = 64, chunk_gib = double(kvp::kDefaultCudaChunkBytes) / (1 << 30);
  if (!flags.Positive("gib", &gib) || !flags.Positive("chunk-gib", &chunk_gib)) {
    return Usage("--gib and --chunk-gib take positive numbers");
  }
  using Report = kvp::bench::AttachResult;
  return Finish<Report>(kvp::bench::RunAttachBench(self, gib, chunk_gib), flags,
                        kvp::bench::AttachTable, [](const Report& r) {
                          cudaDeviceProp prop;
                          cudaGetDeviceProperties(&prop, 0);
                          return kvp::bench::AttachJson(r, kvp::TodayUtc(), prop.name);
                        });
}

int Migrate(const Flags& flags) {
  int source_gpu = 0, target_gpu = 0;
  for (const auto& [name, out] : {std::pair{"source_gpu", &source_gpu}, {"target_gpu", &target_gpu}}) {
    if (flags.Has(name) && !absl::SimpleAtoi(flags.String(name), out)) {
      return Usage(absl::StrCat("--", name, " takes a GPU ordinal"));
    }
  }
  using Report = kvp::bench::MigrateReport;
  return Finish<Report>(kvp::bench::RunMigrateBench(source_gpu, target_gpu), flags,
                        kvp::bench::MigrateTable,
                        [](const Report& r) { return kvp::bench::MigrateJson(r, kvp::TodayUtc()); });
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("missing subcommand");
  const std::string command = argv[1];
  if (command == "--help" || command == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
#if defined(KVP_HAVE_CUDA)
  if (command == "attach-child" && argc == 3) return kvp::bench::AttachChild(argv[2]);
#endif
  const auto args = absl::MakeConstSpan(argv + 2, argc - 2);
  auto run = [&](std::initializer_list<absl::string_view> known, auto&& body) {
    const absl::StatusOr<Flags> flags = Flags::Parse(args, known);
    if (!flags.ok()) return Usage(std::string(flags.status().message()));
    return body(*flags);
  };
  if (command == "accuracy") return run({"seqs", "context", "seed", "json"}, Accuracy);
  if (command == "pool") return run({"json"}, Pool);
  if (command == "broker") return run({"json"}, Broker);
  if (command == "recovery") return run({"sequences", "arena_gib", "cuda", "json"}, Recovery);
#if defined(KVP_HAVE_CUDA)
  if (command == "kernels") return run({"quick", "only", "json"}, Kernels);
  if (command == "attach") {
    return run({"gib", "chunk-gib", "json"}, [&](const Flags& f) { return Attach(argv[0], f); });
  }
  if (command == "migrate") return run({"source_gpu", "target_gpu", "json"}, Migrate);
#else
  if (command == "kernels" || command == "attach" || command == "migrate") {
    std::fprintf(stderr, "kvpool-bench: this build has no CUDA (nvcc was not found)\n");
    return 1;
  }
#endif
  return Usage("unknown subcommand '" + command + "'");
}
