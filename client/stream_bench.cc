#include "client/stream_bench.h"

#include <unistd.h>

#include <chrono>
#include <span>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "client/percentile.h"
#include "client/workload.h"
#include "protocol/transport_names.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

// How a mode sends a prompt.
enum class Sending { kWhole, kSliced, kChunks, kChunksStreamed };

// `runs` prefills of fresh prompts, each released after.
absl::StatusOr<StreamBenchMode> RunMode(
    Client& client, const StreamBenchConfig& config, Sending sending, uint64_t first_seq,
    const std::string& phase,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress) {
  const bool chunked = sending == Sending::kChunks || sending == Sending::kChunksStreamed;
  StreamBenchMode mode{.chunk_tokens = sending == Sending::kWhole ? 0 : config.chunk_tokens};
  std::vector<double> request_ms, ready_ms, move_ms;
  for (int run = 0; run < config.runs; ++run) {
    const uint64_t seq = first_seq + run;
    WorkloadConfig prompt;
    prompt.prompt_tokens = config.context;
    prompt.seed = seq;  // a prompt of its own: no block of it is cached anywhere
    const std::vector<int32_t> tokens = WorkloadPrompt(prompt, 0);
    // An engine's chunks before the last: with `continued` they name the decode pool and stream.
    size_t sent = 0;
    while (chunked && tokens.size() - sent > static_cast<size_t>(config.chunk_tokens)) {
      const Placement early{.pool = config.pool,
                            .decode_pool = sending == Sending::kChunksStreamed ? config.decode_pool
                                                                               : -1,
                            .chunk_tokens = 0,
                            .continued = sending == Sending::kChunksStreamed};
      const std::span<const int32_t> chunk(tokens.data() + sent, config.chunk_tokens);
      RETURN_IF_ERROR(client.Prefill(seq, chunk, nullptr, nullptr, early).status());
      sent += chunk.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(config.chunk_gap_ms));
    }
    const Placement last{.pool = config.pool,
                         .decode_pool = config.decode_pool,
                         .chunk_tokens = sending == Sending::kSliced ? config.chunk_tokens : 0};
    const std::span<const int32_t> rest(tokens.data() + sent, tokens.size() - sent);
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(const PrefillResult r, client.Prefill(seq, rest, nullptr, nullptr, last));
    request_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!r.migration.has_value()) {
      return absl::InternalError("kvpoold's prefill reply has no migration report");
    }
    const MigrationResult& m = *r.migration;
    RETURN_IF_ERROR(m.error);
    if (m.blocks_shared > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          m.blocks_shared, " blocks of a fresh prompt were cached on pool ", config.decode_pool,
          ": the bench needs pools that do not hold its prompts"));
    }
    ready_ms.push_back(m.after_prefill_micros * 1e-3);
    move_ms.push_back(m.micros * 1e-3);
    mode.blocks_moved = m.blocks_moved;
    mode.blocks_streamed = m.streamed_blocks;
    mode.bytes = m.bytes;
    mode.transport = m.transport;
    RETURN_IF_ERROR(client.Release(seq).status());
    progress(phase, run + 1, config.runs);
  }
  mode.request_ms = Percentile(request_ms, 0.5);
  mode.decode_ready_ms = Percentile(ready_ms, 0.5);
  mode.final_move_ms = Percentile(move_ms, 0.5);
  return mode;
}

std::string ModeJson(const StreamBenchMode& m) {
  return absl::StrFormat(
      "{\"chunk_tokens\": %d, \"transport\": \"%s\", \"request_ms\": %.3f, "
      "\"decode_ready_after_prefill_ms\": %.3f, \"final_move_ms\": %.3f, \"blocks_moved\": %u, "
      "\"blocks_streamed\": %u, \"bytes\": %u}",
      m.chunk_tokens, TransportName(m.transport), m.request_ms, m.decode_ready_ms,
      m.final_move_ms, m.blocks_moved, m.blocks_streamed, m.bytes);
}

}  // namespace

absl::StatusOr<StreamBenchReport> RunStreamBench(
    Client& client, const StreamBenchConfig& config,
    const std::function<void(const std::string&, int64_t, int64_t)>& progress) {
  if (config.context <= 0 || config.runs <= 0 || config.chunk_tokens <= 0) {
    return absl::InvalidArgumentError("bench-stream needs a positive --context, --runs and "
                                      "--chunk_tokens");
  }
  if (config.chunk_tokens >= config.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chunk_tokens=", config.chunk_tokens, " is not less than --context=", config.context,
        ": the prompt would be written in one slice"));
  }
  ASSIGN_OR_RETURN(const PoolHealth health, client.Health());
  StreamBenchReport report;
  report.config = config;
  report.spec = health.spec;
  for (const PoolState& p : health.pools) {
    if (p.index == static_cast<uint32_t>(config.pool)) report.pool_gpu = p.gpu;
    if (p.index == static_cast<uint32_t>(config.decode_pool)) report.decode_pool_gpu = p.gpu;
  }
  const uint64_t base = (uint64_t{3} << 60) + static_cast<uint64_t>(::getpid()) * 1'000'000;
  ASSIGN_OR_RETURN(report.whole, RunMode(client, config, Sending::kWhole, base, "whole", progress));
  ASSIGN_OR_RETURN(report.sliced, RunMode(client, config, Sending::kSliced, base + 200'000,
                                          "sliced", progress));
  ASSIGN_OR_RETURN(report.chunks, RunMode(client, config, Sending::kChunks, base + 400'000,
                                          "chunks", progress));
  ASSIGN_OR_RETURN(report.chunks_streamed,
                   RunMode(client, config, Sending::kChunksStreamed, base + 600'000,
                           "chunks, continued", progress));
  return report;
}

std::string StreamBenchTable(const StreamBenchReport& r) {
  std::string out = absl::StrFormat(
      "prefill of %d tokens on pool %d, decoded on pool %d, median of %d runs\n"
      "  %-32s %12s %18s %14s %10s\n",
      r.config.context, r.config.pool, r.config.decode_pool, r.config.runs, "mode", "request ms",
      "decode-ready ms", "final move ms", "streamed");
  auto row = [&](const std::string& name, const StreamBenchMode& m) {
    absl::StrAppend(&out, absl::StrFormat("  %-32s %12.2f %18.3f %14.3f %5u/%-5u\n", name,
                                          m.request_ms, m.decode_ready_ms, m.final_move_ms,
                                          m.blocks_streamed, m.blocks_moved));
  };
  row(absl::StrCat("whole, then moved (", TransportName(r.whole.transport), ")"), r.whole);
  row(absl::StrCat("slices of ", r.sliced.chunk_tokens, " (", TransportName(r.sliced.transport),
                   ")"),
      r.sliced);
  row(absl::StrCat("chunks of ", r.chunks.chunk_tokens, ", last moves all"), r.chunks);
  row(absl::StrCat("chunks of ", r.chunks.chunk_tokens, ", continued"), r.chunks_streamed);
  absl::StrAppend(&out, absl::StrFormat(
      "  request: the one that moves it (chunks: the last; the engine pauses %d ms between "
      "chunks)\n  decode-ready: kvpoold's time from the last write to the commit on the "
      "decode pool\n", r.config.chunk_gap_ms));
  return out;
}

std::string StreamBenchJson(const StreamBenchReport& r, const std::string& date,
                            const std::string& host, const std::string& device) {
  return absl::StrFormat(
      "{\n  \"bench\": \"stream\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"device\": \"%s\",\n  \"pool\": \"%s\",\n  \"context\": %d,\n  \"runs\": %d,\n"
      "  \"from_pool\": %d,\n  \"from_gpu\": %d,\n  \"to_pool\": %d,\n  \"to_gpu\": %d,\n"
      "  \"chunk_gap_ms\": %d,\n  \"whole\": %s,\n  \"sliced\": %s,\n  \"chunks\": %s,\n"
      "  \"chunks_continued\": %s\n}\n",
      date, host, device, r.spec.DebugString(), r.config.context, r.config.runs, r.config.pool,
      r.pool_gpu, r.config.decode_pool, r.decode_pool_gpu, r.config.chunk_gap_ms,
      ModeJson(r.whole), ModeJson(r.sliced), ModeJson(r.chunks), ModeJson(r.chunks_streamed));
}

}  // namespace kvp
