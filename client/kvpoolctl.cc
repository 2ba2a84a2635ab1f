// kvpoolctl: talk to kvpoold from the command line.
//
//   kvpoolctl health | stats
//   kvpoolctl prefill SEQ [--tokens=N | --token_ids=1,2,3] [--pool=P] [--decode_pool=D]
//                     [--chunk_tokens=C] [--continued]
//   kvpoolctl migrate SEQ --to=POOL
//   kvpoolctl decode SEQ [--token=T] [--steps=N]
//   kvpoolctl fork SRC DST | release SEQ
//   kvpoolctl bench [--sequences=16 --prompt=2048 --steps=64 ...] [--json] [--out=FILE]
//   kvpoolctl bench-control [--requests=20000] [--json] [--out=FILE]
//   kvpoolctl bench-decode [--batch=64 --context=32768 --steps=20 --pool_kind=mla] [--json]
//                          [--out=FILE]
//   kvpoolctl bench-stream [--context=65536 --chunk_tokens=8192 --runs=5 --pool=0
//                          --decode_pool=1] [--json] [--out=FILE]
//   kvpoolctl curve-keygen FILE   (a CURVE key pair: FILE holds the secret, FILE.pub the public)
//
// Remote kvpoold (its --tcp_endpoint): --endpoint=tcp://HOST:PORT --curve_server_key=FILE
// --curve_secret_key=FILE, where kvpoold lists this client's public key in --curve_clients_file.
//
// Sequences belong to the client name (--name, default "kvpoolctl"), so successive commands see
// each other's sequences while kvpoold's client lease lasts. Concurrent invocations need distinct
// names: a name connecting again takes over the earlier connection's replies.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/flag_file.h"
#include "base/malloc_tuning.h"
#include "base/run_info.h"
#include "base/status_macros.h"
#include "client/calibrate.h"
#include "client/client.h"
#include "client/control_bench.h"
#include "client/stream_bench.h"
#include "client/decode_bench.h"
#include "client/progress.h"
#include "client/workload.h"
#include "kvpool/format/kv_format_names.h"
#include "protocol/curve.h"
#include "protocol/endpoints.h"

ABSL_FLAG(std::string, endpoint, "", "kvpoold's endpoint; default ipc://<runtime dir>/kvpoold.sock");
ABSL_FLAG(std::string, name, "kvpoolctl", "client name: sequences belong to it");
ABSL_FLAG(int, timeout_ms, 120000, "how long to wait for each reply");
ABSL_FLAG(int, tokens, 64, "prefill: number of synthetic prompt tokens");
ABSL_FLAG(std::string, token_ids, "", "prefill: explicit token ids, comma-separated");
ABSL_FLAG(int, pool, -1, "prefill: the pool it runs on (-1: kvpoold chooses)");
ABSL_FLAG(std::string, decode_pool, "",
          "prefill: the pool the sequence is decoded on, moved there once written: P, or NODE/P "
          "for pool P of a peer node (empty: stays)");
ABSL_FLAG(int, chunk_tokens, -1,
          "prefill with --decode_pool: slices whose blocks move while the next is written (-1: "
          "kvpoold's --prefill_chunk_tokens, 0: whole); bench-stream: the sliced runs' (-1: 8192)");
ABSL_FLAG(int, runs, 5, "bench-stream: prefills per mode");
ABSL_FLAG(int, chunk_gap_ms, 10, "bench-stream: the engine's pause between its chunks");
ABSL_FLAG(bool, continued, false,
          "prefill with --decode_pool: more prefills of the sequence follow; its blocks stream "
          "there as they fill, and the last prefill (without --continued) moves it");
ABSL_FLAG(std::string, to, "",
          "migrate: the pool to move the sequence to: P, or NODE/P for pool P of a peer node");
ABSL_FLAG(int, token, 1, "decode: the new token id");
ABSL_FLAG(int, steps, 1, "decode: steps to run; bench-decode: timed steps");
ABSL_FLAG(int, sequences, 16, "bench: sequences");
ABSL_FLAG(int, prompt, 2048, "bench: prompt tokens per sequence");
ABSL_FLAG(int, decode_steps, 64, "bench: decode steps");
ABSL_FLAG(int, shared_prefix, 0, "bench: leading prompt tokens all sequences share");
ABSL_FLAG(int, verify_sequences, 4, "bench: sequences checked against a bf16 reference");
ABSL_FLAG(std::string, outputs, "", "what decode replies carry: all, last or none (bench: all, "
          "bench-decode: last)");
ABSL_FLAG(double, needle_gain, 0.35, "bench: how strongly each step's query leans on its needle");
ABSL_FLAG(int, batch, 64, "bench-decode: sequences per step (forks of one prompt)");
ABSL_FLAG(std::string, pool_kind, "",
          "bench-decode: the pool kind kvpoold must serve, kv or mla (kvpoold --pool_kind); "
          "empty: whatever it serves");
ABSL_FLAG(int, context, 32768, "bench-decode, bench-stream: prompt tokens");
ABSL_FLAG(std::string, placement, "default",
          "bench-decode: how kvpoold, the workers and this client sit on CPUs (for example "
          "'one core each'), recorded in the report");
ABSL_FLAG(int, requests, 20000, "bench-control: append + commit pairs");
ABSL_FLAG(std::string, device, "", "bench: device name recorded in the JSON");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(std::string, out, "", "also write the JSON report to this file");
ABSL_FLAG(std::string, curve_server_key, "",
          "tcp:// endpoints: file of kvpoold's CURVE public key (Z85; kvpoold logs it)");
ABSL_FLAG(std::string, curve_secret_key, "",
          "tcp:// endpoints: file of this client's CURVE secret key (kvpoolctl curve-keygen)");
ABSL_FLAG(int, wait_workers_ms, 30000, "bench: wait this long for a prefill and a decode worker");
ABSL_FLAG(std::string, k_samples, "",
          "calibrate: sample K, float32 [layers, tokens, kv_heads, head_dim]");
ABSL_FLAG(std::string, v_samples, "", "calibrate: sample V, float32 as --k_samples");
ABSL_FLAG(int, layers, 4, "calibrate: the pool's layers");
ABSL_FLAG(int, head_dim, 128, "calibrate: the pool's head dimension");
ABSL_FLAG(std::string, k_format, "fp8_e4m3", "calibrate: the pool's K format");
ABSL_FLAG(std::string, v_format, "turbo3", "calibrate: the pool's V format");
ABSL_FLAG(bool, v_rotation, true, "calibrate: the pool's TurboNV rotation");

namespace kvp {
namespace {

// The per-layer settings the kernels run with, as kvpoold's flags would give them.
std::string PoolLine(const PoolState& p) {
  return absl::StrFormat(
      "pool %u (%s): free=%llu reserved=%llu used=%llu cached=%llu sequences=%u workers: "
      "prefill=%u decode=%u",
      p.index, p.gpu < 0 ? std::string("host") : absl::StrCat("gpu ", p.gpu),
      (unsigned long long)p.blocks_free, (unsigned long long)p.blocks_reserved,
      (unsigned long long)p.blocks_used, (unsigned long long)p.blocks_cached, p.sequences,
      p.prefill_workers, p.decode_workers);
}

std::string MigrationLine(const MigrationResult& m) {
  std::string line = absl::StrFormat(
      "moved pool %u -> pool %s%u by %s: %u blocks copied, %u shared, %llu bytes in %.3f ms",
      m.from_pool, m.to_node.empty() ? "" : m.to_node + "/", m.to_pool, TransportName(m.transport),
      m.blocks_moved, m.blocks_shared, (unsigned long long)m.bytes, m.micros * 1e-3);
  if (m.streamed_blocks > 0 || m.after_prefill_micros > 0) {
    absl::StrAppendFormat(&line, " (%u blocks while it was prefilled; decode-ready %.3f ms "
                          "after the prefill's last write)", m.streamed_blocks,
                          m.after_prefill_micros * 1e-3);
  }
  if (!m.error.ok()) line = absl::StrCat("not moved: ", m.error.ToString());
  return line;
}

std::string SettingsLine(const PoolSpec& spec, const ModelConfig& model) {
  std::vector<float> k, v;
  std::vector<int> windows;
  for (int l = 0; l < spec.num_layers; ++l) {
    k.push_back(spec.KScale(l));
    v.push_back(spec.VScale(l));
    windows.push_back(model.Window(l));
  }
  return absl::StrCat("k_scales=", absl::StrJoin(k, ","), " v_scales=", absl::StrJoin(v, ","),
                      " sliding_windows=", absl::StrJoin(windows, ","),
                      " sparse_v_threshold=", model.sparse_v_threshold);
}

absl::StatusOr<uint64_t> Number(const std::vector<char*>& args, size_t i, const char* what) {
  uint64_t v;
  if (i >= args.size() || !absl::SimpleAtoi(args[i], &v)) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", what, " as argument ", i));
  }
  return v;
}

absl::StatusOr<wire::OutputLayers> ParseOutputs(const std::string& name,
                                                wire::OutputLayers fallback) {
  if (name.empty()) return fallback;
  if (name == "all") return wire::OutputLayers::ALL;
  if (name == "last") return wire::OutputLayers::LAST;
  if (name == "none") return wire::OutputLayers::NONE;
  return absl::InvalidArgumentError(absl::StrCat("--outputs=", name, ": expected all, last or none"));
}

absl::Status Emit(const std::string& table, const std::string& json) {
  std::cout << (absl::GetFlag(FLAGS_json) ? json : table);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::ofstream file(out);
    file << json;
    if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", out));
  }
  return absl::OkStatus();
}

// --decode_pool as a pool address; pool -1 when it is not given.
absl::StatusOr<PoolAddress> DecodePoolFlag() {
  const std::string text = absl::GetFlag(FLAGS_decode_pool);
  if (text.empty() || text == "-1") return PoolAddress{};
  return ParsePoolAddress(text);
}

absl::Status WaitForWorkers(Client& client) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(absl::GetFlag(FLAGS_wait_workers_ms));
  while (true) {
    absl::StatusOr<PoolHealth> h = client.Health();
    if (h.ok() && h->workers >= 2) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError(
          h.ok() ? absl::StrCat("only ", h->workers, " workers registered; need a prefill and a "
                                "decode worker")
                 : std::string(h.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// A new key pair: the secret in `path` (0600), the public key in `path`.pub and on stdout.
absl::Status CurveKeygen(const std::vector<char*>& args) {
  if (args.size() != 3) return absl::InvalidArgumentError("curve-keygen takes one FILE");
  const std::string path = args[2];
  ASSIGN_OR_RETURN(const CurveKeyPair keys, NewCurveKeyPair());
  RETURN_IF_ERROR(WriteCurveKeyFile(path, keys.secret_key, 0600));
  RETURN_IF_ERROR(WriteCurveKeyFile(path + ".pub", keys.public_key, 0644));
  std::printf("%s\n", keys.public_key.c_str());
  return absl::OkStatus();
}

// The client's CURVE keys from the flags: both files or neither.
absl::StatusOr<std::optional<CurveClientKeys>> CurveKeysFromFlags() {
  const std::string server = absl::GetFlag(FLAGS_curve_server_key);
  const std::string secret = absl::GetFlag(FLAGS_curve_secret_key);
  if (server.empty() && secret.empty()) return std::nullopt;
  if (server.empty() || secret.empty()) {
    return absl::InvalidArgumentError("--curve_server_key and --curve_secret_key go together");
  }
  CurveClientKeys keys;
  ASSIGN_OR_RETURN(keys.server_public_key, ReadCurveKeyFile(server));
  ASSIGN_OR_RETURN(const std::string own_secret, ReadCurveKeyFile(secret));
  ASSIGN_OR_RETURN(keys.own, CurveKeyPairFromSecret(own_secret));
  return keys;
}

absl::Status Run(const std::vector<char*>& args) {
  if (args.size() < 2) return absl::InvalidArgumentError("no command; see --help");
  const std::string command = args[1];
  if (command == "curve-keygen") return CurveKeygen(args);
  if (command == "calibrate") {
    CalibrateOptions c;
    c.k_samples = absl::GetFlag(FLAGS_k_samples);
    c.v_samples = absl::GetFlag(FLAGS_v_samples);
    c.layers = absl::GetFlag(FLAGS_layers);
    c.head_dim = absl::GetFlag(FLAGS_head_dim);
    ASSIGN_OR_RETURN(c.k_format, ParseKvFormat(absl::GetFlag(FLAGS_k_format)));
    ASSIGN_OR_RETURN(c.v_format, ParseKvFormat(absl::GetFlag(FLAGS_v_format)));
    c.v_rotation = absl::GetFlag(FLAGS_v_rotation);
    ASSIGN_OR_RETURN(const std::string report, Calibrate(c));
    std::fputs(report.c_str(), stdout);
    return absl::OkStatus();
  }
  ClientOptions options;
  options.endpoint = absl::GetFlag(FLAGS_endpoint);
  options.name = absl::GetFlag(FLAGS_name);
  options.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  ASSIGN_OR_RETURN(options.curve, CurveKeysFromFlags());
  if (absl::StartsWith(options.endpoint, "tcp://") && !options.curve.has_value()) {
    return absl::InvalidArgumentError(
        "tcp:// endpoints are CURVE only: give --curve_server_key and --curve_secret_key");
  }
  Client client(options);

  if (command == "health") {
    ASSIGN_OR_RETURN(PoolHealth h, client.Health());
    std::printf("ready=%d draining=%d workers=%u epoch=%llu\npool: %s q_heads=%d topk=%d\n",
                h.ready, h.draining, h.workers, static_cast<unsigned long long>(h.epoch),
                h.spec.DebugString().c_str(), h.model.num_q_heads, h.model.topk);
    std::printf("%s\nclient limits: max_blocks=%llu max_requests=%u\n",
                SettingsLine(h.spec, h.model).c_str(),
                static_cast<unsigned long long>(h.client_max_blocks), h.client_max_requests);
    for (const PoolState& p : h.pools) std::printf("%s\n", PoolLine(p).c_str());
    return absl::OkStatus();
  }
  if (command == "stats") {
    ASSIGN_OR_RETURN(PoolStats s, client.Stats());
    ASSIGN_OR_RETURN(PoolHealth h, client.Health());
    std::printf(
        "blocks: free=%llu reserved=%llu used=%llu cached=%llu\nprefix_hit_blocks=%llu "
        "leases=%u sequences=%u rejected_nonfinite=%llu\nthis client: blocks=%llu of %llu, "
        "requests in flight=%u of %u\n%s\n",
        (unsigned long long)s.blocks_free, (unsigned long long)s.blocks_reserved,
        (unsigned long long)s.blocks_used, (unsigned long long)s.blocks_cached,
        (unsigned long long)s.prefix_hit_blocks, s.leases, s.sequences,
        (unsigned long long)s.rejected_nonfinite, (unsigned long long)s.client_blocks,
        (unsigned long long)h.client_max_blocks, s.client_requests_in_flight,
        h.client_max_requests, SettingsLine(h.spec, h.model).c_str());
    for (const PoolState& p : s.pools) std::printf("%s\n", PoolLine(p).c_str());
    if (s.recovery.state_dir) {
      std::printf("last start: recovered %llu sequences and %llu blocks, serving %.1f ms after "
                  "start\n",
                  (unsigned long long)s.recovery.sequences, (unsigned long long)s.recovery.blocks,
                  s.recovery.micros / 1e3);
    } else {
      std::printf("last start: no --state_dir, the cache does not survive a restart\n");
    }
    for (const PoolStats::Peer& p : s.peers) {
      std::printf("peer %s at %s: %s (heard %llu ms ago), %u sequences of this node there\n",
                  p.name.c_str(), p.endpoint.c_str(), p.reachable ? "reachable" : "unreachable",
                  (unsigned long long)p.last_heard_millis, p.sequences);
    }
    for (const PoolStats::RemoteSequence& r : s.remote_sequences) {
      std::printf("sequence %llu lives on %s/%u\n", (unsigned long long)r.sequence,
                  r.node.c_str(), r.pool);
    }
    return absl::OkStatus();
  }
  if (command == "prefill") {
    ASSIGN_OR_RETURN(uint64_t seq, Number(args, 2, "a sequence id"));
    std::vector<int32_t> tokens;
    const std::string ids = absl::GetFlag(FLAGS_token_ids);
    for (absl::string_view part : absl::StrSplit(ids, ',', absl::SkipEmpty())) {
      int32_t t;
      if (!absl::SimpleAtoi(part, &t)) {
        return absl::InvalidArgumentError(absl::StrCat("--token_ids: '", part, "'"));
      }
      tokens.push_back(t);
    }
    if (tokens.empty()) {
      WorkloadConfig c;
      c.prompt_tokens = absl::GetFlag(FLAGS_tokens);
      c.seed = seq;
      tokens = WorkloadPrompt(c, 0);
    }
    ASSIGN_OR_RETURN(const PoolAddress decode, DecodePoolFlag());
    const Placement placement{.pool = absl::GetFlag(FLAGS_pool),
                              .decode_pool = decode.pool,
                              .decode_node = decode.node,
                              .chunk_tokens = absl::GetFlag(FLAGS_chunk_tokens),
                              .continued = absl::GetFlag(FLAGS_continued)};
    ASSIGN_OR_RETURN(PrefillResult r, client.Prefill(seq, tokens, nullptr, nullptr, placement));
    std::printf("sequence %llu: length %lld (%d prefix-hit tokens), pool %s%u\n",
                static_cast<unsigned long long>(seq), static_cast<long long>(r.length),
                r.prefix_hit_tokens, r.node.empty() ? "" : (r.node + "/").c_str(), r.pool);
    if (r.migration.has_value()) {
      std::printf("%s\n", MigrationLine(*r.migration).c_str());
      if (!r.migration->error.ok()) return r.migration->error;
    }
    return absl::OkStatus();
  }
  if (command == "migrate") {
    ASSIGN_OR_RETURN(uint64_t seq, Number(args, 2, "a sequence id"));
    if (absl::GetFlag(FLAGS_to).empty()) {
      return absl::InvalidArgumentError("migrate needs --to=POOL or --to=NODE/POOL");
    }
    ASSIGN_OR_RETURN(const PoolAddress to, ParsePoolAddress(absl::GetFlag(FLAGS_to)));
    ASSIGN_OR_RETURN(MigrationResult m,
                     client.Migrate(seq, static_cast<uint32_t>(to.pool), to.node));
    std::printf("sequence %llu (length %lld): %s\n", static_cast<unsigned long long>(seq),
                static_cast<long long>(m.length), MigrationLine(m).c_str());
    return absl::OkStatus();
  }
  if (command == "decode") {
    ASSIGN_OR_RETURN(uint64_t seq, Number(args, 2, "a sequence id"));
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) {
      DecodeStepRequest step{seq, absl::GetFlag(FLAGS_token), std::nullopt, nullptr, nullptr};
      ASSIGN_OR_RETURN(DecodeResult r, client.Decode({step}, wire::OutputLayers::LAST));
      const DecodeStepResult& s = r.steps.at(0);
      double norm = 0;
      for (float v : s.out.at(0)) norm += double(v) * v;
      std::printf("sequence %llu: length %lld, last layer |o| = %.4f, worker %.3f ms\n",
                  static_cast<unsigned long long>(seq), static_cast<long long>(s.length),
                  std::sqrt(norm), r.worker_micros * 1e-3);
    }
    return absl::OkStatus();
  }
  if (command == "fork") {
    ASSIGN_OR_RETURN(uint64_t src, Number(args, 2, "a source sequence"));
    ASSIGN_OR_RETURN(uint64_t dst, Number(args, 3, "a target sequence"));
    ASSIGN_OR_RETURN(uint32_t shared, client.Fork(src, dst));
    std::printf("sequence %llu shares %u blocks of %llu\n", (unsigned long long)dst, shared,
                (unsigned long long)src);
    return absl::OkStatus();
  }
  if (command == "release") {
    ASSIGN_OR_RETURN(uint64_t seq, Number(args, 2, "a sequence id"));
    ASSIGN_OR_RETURN(uint32_t blocks, client.Release(seq));
    std::printf("sequence %llu released (%u blocks)\n", (unsigned long long)seq, blocks);
    return absl::OkStatus();
  }
  if (command == "bench") {
    RETURN_IF_ERROR(WaitForWorkers(client));
    WorkloadConfig c;
    c.sequences = absl::GetFlag(FLAGS_sequences);
    c.prompt_tokens = absl::GetFlag(FLAGS_prompt);
    c.decode_steps = absl::GetFlag(FLAGS_decode_steps);
    c.shared_prefix_tokens = absl::GetFlag(FLAGS_shared_prefix);
    c.verify_sequences = absl::GetFlag(FLAGS_verify_sequences);
    ASSIGN_OR_RETURN(c.outputs, ParseOutputs(absl::GetFlag(FLAGS_outputs), wire::OutputLayers::ALL));
    c.needle_gain = static_cast<float>(absl::GetFlag(FLAGS_needle_gain));
    ProgressBar bar;
    ASSIGN_OR_RETURN(WorkloadReport report,
                     RunWorkload(client, c, [&](const std::string& phase, int64_t done,
                                                int64_t total) { bar.Update(phase, done, total); }));
    return Emit(WorkloadTable(report),
                WorkloadJson(report, TodayUtc(), Hostname(), absl::GetFlag(FLAGS_device)));
  }
  if (command == "bench-control") {
    ProgressBar bar;
    ASSIGN_OR_RETURN(ControlBenchReport report,
                     RunControlBench(client, absl::GetFlag(FLAGS_requests),
                                     [&](int64_t done, int64_t total) {
                                       bar.Update("requests", done, total);
                                     }));
    return Emit(ControlBenchTable(report), ControlBenchJson(report, TodayUtc(), Hostname()));
  }
  if (command == "bench-decode") {
    RETURN_IF_ERROR(WaitForWorkers(client));
    DecodeBenchConfig c;
    c.batch = absl::GetFlag(FLAGS_batch);
    c.context = absl::GetFlag(FLAGS_context);
    c.steps = absl::GetFlag(FLAGS_steps);
    c.placement = absl::GetFlag(FLAGS_placement);
    if (!absl::GetFlag(FLAGS_pool_kind).empty()) {
      ASSIGN_OR_RETURN(c.pool_kind, ParsePoolKind(absl::GetFlag(FLAGS_pool_kind)));
    }
    ASSIGN_OR_RETURN(c.outputs,
                     ParseOutputs(absl::GetFlag(FLAGS_outputs), wire::OutputLayers::LAST));
    ProgressBar bar;
    ASSIGN_OR_RETURN(DecodeBenchReport report,
                     RunDecodeBench(client, c, [&](const std::string& phase, int64_t done,
                                                   int64_t total) { bar.Update(phase, done, total); }));
    return Emit(DecodeBenchTable(report),
                DecodeBenchJson(report, TodayUtc(), Hostname(), absl::GetFlag(FLAGS_device)));
  }
  if (command == "bench-stream") {
    RETURN_IF_ERROR(WaitForWorkers(client));
    StreamBenchConfig c;
    c.context = absl::GetFlag(FLAGS_context);
    if (absl::GetFlag(FLAGS_chunk_tokens) >= 0) c.chunk_tokens = absl::GetFlag(FLAGS_chunk_tokens);
    c.runs = absl::GetFlag(FLAGS_runs);
    c.chunk_gap_ms = absl::GetFlag(FLAGS_chunk_gap_ms);
    c.pool = std::max(0, absl::GetFlag(FLAGS_pool));
    ASSIGN_OR_RETURN(const PoolAddress decode, DecodePoolFlag());
    if (!decode.node.empty()) {
      return absl::InvalidArgumentError("bench-stream streams between pools of one node");
    }
    c.decode_pool = decode.pool >= 0 ? decode.pool : 1;
    ProgressBar bar;
    const auto progress = [&](const std::string& phase, int64_t done, int64_t total) {
      bar.Update(phase, done, total);
    };
    ASSIGN_OR_RETURN(StreamBenchReport report, RunStreamBench(client, c, progress));
    return Emit(StreamBenchTable(report),
                StreamBenchJson(report, TodayUtc(), Hostname(), absl::GetFlag(FLAGS_device)));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'; see --help"));
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvpoolctl COMMAND [ARGS]: health, stats, prefill SEQ, decode SEQ, migrate SEQ --to=P, "
      "fork SRC DST, "
      "release SEQ, bench, bench-control, bench-decode, bench-stream, curve-keygen FILE, "
      "calibrate");
  kvp::KeepFreedMemoryForReuse();
  std::vector<std::string> storage;
  const absl::StatusOr<std::vector<char*>> args =
      kvp::ParseCommandLineWithFlagFiles(argc, argv, storage);
  if (!args.ok()) {
    std::fprintf(stderr, "kvpoolctl: %s\n", args.status().ToString().c_str());
    return 2;
  }
  const absl::Status status = kvp::Run(*args);
  if (!status.ok()) {
    std::fprintf(stderr, "kvpoolctl: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
