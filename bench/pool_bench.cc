#include "bench/pool_bench.h"

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"
#include "kvpool/pool/block_allocator.h"
#include "kvpool/pool/sequence_table.h"

namespace kvp::bench {
namespace {

// Runs `body(i)` for `n` iterations, `reps` times; returns the best rate in operations per second.
template <typename Body>
double BestRate(int64_t n, int reps, Body&& body) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) body(i);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, n / s);
  }
  return best;
}

}  // namespace

absl::StatusOr<PoolBenchResult> RunPoolBench() {
  PoolBenchResult r;
  constexpr int32_t kBlocks = 1 << 16;
  {
    BlockAllocator a(kBlocks);
    std::vector<BlockId> held;
    held.reserve(kBlocks);
    r.reserve_commit_per_s = BestRate(4'000'000, 3, [&](int64_t i) {
      const BlockId b = a.Reserve(1, 1).value()[0];
      a.Commit(1, b, std::nullopt).IgnoreError();
      held.push_back(b);
      if (held.size() == kBlocks / 2 || i % 4096 == 4095) {  // keep the pool half full
        for (BlockId x : held) a.Release(1, x).IgnoreError();
        held.clear();
      }
    });
  }
  {
    BlockAllocator a(kBlocks);
    SequenceTable seqs(&a, 64);
    std::vector<int32_t> tokens(64);
    r.append_commit_per_s = BestRate(1'000'000, 3, [&](int64_t i) {
      const SeqId seq = static_cast<SeqId>(i % 512);
      std::iota(tokens.begin(), tokens.end(), static_cast<int32_t>(i * 64));  // no prefix hits
      if (!seqs.Append(seq, 1, tokens).ok()) return;
      seqs.Commit(seq).IgnoreError();
      if (i % 512 == 511) {
        for (SeqId s = 0; s < 512; ++s) seqs.Release(s).IgnoreError();
      }
    });
  }
  {
    BlockAllocator a(kBlocks);
    SequenceTable seqs(&a, 64);
    std::vector<int32_t> tokens(64, 7);
    seqs.Append(0, 1, tokens).IgnoreError();
    seqs.Commit(0).IgnoreError();
    r.prefix_hit_per_s = BestRate(1'000'000, 3, [&](int64_t i) {
      const SeqId seq = 1 + static_cast<SeqId>(i % 1024);
      if (seqs.Append(seq, 1, tokens).ok()) seqs.Commit(seq).IgnoreError();
      if (i % 1024 == 1023) {
        for (SeqId s = 1; s <= 1024; ++s) seqs.Release(s).IgnoreError();
      }
    });
  }
  return r;
}

std::string PoolTable(const PoolBenchResult& r) {
  return absl::StrFormat(
      "| operation (one core) | per second |\n| --- | ---: |\n"
      "| reserve + commit + release of one block | %.2fM |\n"
      "| append one 64-token block to a sequence + commit | %.2fM |\n"
      "| new sequence hits one block by prefix + commit | %.2fM |\n",
      r.reserve_commit_per_s / 1e6, r.append_commit_per_s / 1e6, r.prefix_hit_per_s / 1e6);
}

std::string PoolJson(const PoolBenchResult& r, const std::string& date, const std::string& host) {
  return absl::StrFormat(
      "{\n  \"benchmark\": \"pool\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"reserve_commit_release_per_s\": %.0f,\n  \"append_commit_per_s\": %.0f,\n"
      "  \"prefix_hit_per_s\": %.0f\n}\n",
      date, host, r.reserve_commit_per_s, r.append_commit_per_s, r.prefix_hit_per_s);
}

}  // namespace kvp::bench
