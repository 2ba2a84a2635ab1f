// kvpoold: owns the pools' arenas (one per GPU, or --pools memfd pools) and serves requests and
// workers (docs/design.md §1). Flags may
// come from a file (--flagfile=/etc/kvpool/kvpoold.flags); see deploy/.
#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/flag_file.h"
#include "base/journal_sink.h"
#include "base/malloc_tuning.h"
#include "base/status_macros.h"
#include "daemon/broker.h"
#include "daemon/crash_points.h"
#include "daemon/daemon_loop.h"
#include "daemon/fd_store.h"
#include "daemon/peers.h"
#include "daemon/recovery.h"
#include "daemon/served_arena.h"
#include "kvpool/format/kv_format_names.h"
#include "kvpool/layout/block_layout.h"
#include "kvpool/pool/clock.h"
#include "kvpool/pool/pool_set.h"
#include "protocol/curve.h"
#include "protocol/endpoints.h"
#include "protocol/transport_names.h"
#include "protocol/spec_codec.h"

ABSL_FLAG(std::string, runtime_dir, "",
          "directory (mode 0700) of the sockets; default $KVPOOL_RUNTIME_DIR, $RUNTIME_DIRECTORY, "
          "/run/kvpool for root, else $XDG_RUNTIME_DIR/kvpool or /tmp/kvpool-<uid>");
ABSL_FLAG(std::string, endpoint, "", "ZeroMQ endpoint; default ipc://<runtime_dir>/kvpoold.sock");
ABSL_FLAG(std::string, tcp_endpoint, "",
          "also serve remote clients at tcp://HOST:PORT, CURVE only (docs/design.md §8): needs "
          "--curve_secret_key_file and --curve_clients_file");
ABSL_FLAG(std::string, curve_secret_key_file, "",
          "kvpoold's CURVE secret key, Z85 (kvpoolctl curve-keygen makes one)");
ABSL_FLAG(std::string, curve_clients_file, "",
          "the public keys (Z85, one per line; lines starting with # are comments) of the clients "
          "the tcp endpoint admits");
ABSL_FLAG(std::string, node_name, "",
          "this node's name among its peers (1-63 of a-z, 0-9 and '-'); needed with --peers_file");
ABSL_FLAG(std::string, peers_file, "",
          "the other nodes' kvpoolds, one a line: NAME tcp://HOST:PORT PUBLIC_KEY (their "
          "--tcp_endpoint and its CURVE public key); they are linked to over CURVE and admitted on "
          "--tcp_endpoint, and must list this node too (docs/design.md §11)");
ABSL_FLAG(std::string, backend, "auto", "arena: auto (cuda when a GPU is visible), cuda or host");
ABSL_FLAG(int, gpu, 0, "GPU of the cuda arena, when --gpus is not given");
ABSL_FLAG(std::string, gpus, "",
          "cuda backend: a pool on each of these GPUs, comma-separated (a GPU named twice gets two "
          "pools); default --gpu");
ABSL_FLAG(int, pools, 1, "host backend: this many memfd pools (they stand in for GPUs)");
ABSL_FLAG(int64_t, arena_mib, 1024, "arena size of each pool in MiB");
ABSL_FLAG(std::string, pool_kind, "kv",
          "kv: FP8 K + TurboNV V per kv head (the flags below); mla: DeepSeek's 656-byte fp8_ds_mla "
          "latent per token shared by all query heads, with the indexer (--layers, --block_size "
          "and --q_heads apply; the K/V flags do not)");
ABSL_FLAG(int, layers, 4, "layers of the pool");
ABSL_FLAG(int, kv_heads, 8, "kv heads");
ABSL_FLAG(int, head_dim, 128, "head dimension: 64, 128 or 256");
ABSL_FLAG(int, block_size, 64, "tokens per block: 16, 32 or 64");
ABSL_FLAG(std::string, k_format, "fp8_e4m3", "K format: bf16 or fp8_e4m3");
ABSL_FLAG(std::string, v_format, "turbo3", "V format: bf16, turbo2, turbo3 or turbo4");
ABSL_FLAG(bool, v_rotation, true, "TurboNV Walsh-Hadamard rotation of V");
ABSL_FLAG(bool, indexer, true, "lightning-indexer sections (sparse decode); false: dense decode");
ABSL_FLAG(std::string, k_scales, "",
          "per-layer K scale (docs/design.md §3: stored byte = E4M3(k / k_scale)): one value for "
          "every layer or one per layer, comma-separated, finite and > 0; default 1 (kvpoolctl "
          "calibrate picks them from sample K/V)");
ABSL_FLAG(std::string, v_scales, "",
          "per-layer V scale of the TurboNV group scales (keeps small V out of E4M3's subnormal "
          "range): one value or one per layer, finite and > 0; default 1");
ABSL_FLAG(std::string, sliding_windows, "",
          "per-layer sliding window of dense decode (0: all positions): one value or one per "
          "layer; needs --indexer=false");
ABSL_FLAG(double, softmax_scale, 0.0,
          "the attention's softmax scale; 0: 1/sqrt(head_dim), or DeepSeek-V3.2's 0.1352 for "
          "--pool_kind=mla");
ABSL_FLAG(double, sparse_v_threshold, 0.0,
          "sparse-V threshold τ >= 0: positions whose softmax weight is <= τ skip their V; 0: "
          "exact");
ABSL_FLAG(int, q_heads, 32, "query heads of the decode model");
ABSL_FLAG(int, topk, 2048, "positions the indexer selects per layer");
ABSL_FLAG(uint64_t, synthetic_seed, 0x6B76706F6F6Cull, "seed of the synthetic model");
ABSL_FLAG(int, heartbeat_ms, 1000, "heartbeat period told to workers");
ABSL_FLAG(int, lease_expiry_ms, 3000, "a worker lease not renewed for this long expires");
ABSL_FLAG(int, client_lease_ms, 30000, "a client lease not renewed for this long expires");
ABSL_FLAG(std::string, transport, "auto",
          "how migrations move blocks: auto (host pools: host; one GPU or peer access: peer_copy; "
          "else nccl), or host, peer_copy, nccl or socket for every move (one it cannot make is "
          "refused with UNIMPLEMENTED)");
ABSL_FLAG(int, transfer_timeout_ms, 20000,
          "a move over nccl or socket must end within this, its rendezvous included");
ABSL_FLAG(int, prefill_chunk_tokens, -1,
          "a prefill decoded on another pool is written in slices of this many tokens, each "
          "slice's blocks moved there while the next is written; 0: written whole, moved after; "
          "-1: 8192 on host pools, 0 on cuda pools (a request's chunkTokens overrides it)");
ABSL_FLAG(int, max_job_attempts, 2, "workers a job is tried on before it fails with ABORTED");
ABSL_FLAG(std::string, allow_uids, "", "uids (comma-separated) allowed to attach; ours always");
ABSL_FLAG(std::string, allow_gids, "", "gids (comma-separated) allowed to attach");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1", "address of the HTTP endpoint");
ABSL_FLAG(int, metrics_port, 9464, "port of /metrics and /healthz; -1 disables, 0 picks one");
ABSL_FLAG(int64_t, max_message_mib, 256, "largest message accepted; bigger ones get INVALID_ARGUMENT");
ABSL_FLAG(int, drain_timeout_ms, 30000, "on SIGTERM, how long jobs in flight may take");
ABSL_FLAG(int64_t, client_max_blocks, -1,
          "blocks one client may hold (its sequences' and reservations'); -1: 90% of the pool, "
          "0: no limit");
ABSL_FLAG(int, client_max_requests, 256,
          "prefill and decode requests one client may have queued or running");
ABSL_FLAG(std::string, state_dir, "",
          "keep the cache across restarts (docs/design.md §10): the state log goes here (0700), the "
          "arena's chunks into systemd's fd store; empty: every start is empty");
ABSL_FLAG(int, recovery_grace_ms, 30000,
          "after a restart, client leases live this long at least, so that clients come back "
          "before their sequences are reaped");
ABSL_FLAG(int, recovery_quarantine_ms, 60000,
          "after a restart, blocks a job of the last kvpoold was writing stay out of use until its "
          "workers have registered again or exited, or this long at most");
ABSL_FLAG(int, recovery_wait_ms, 10000,
          "after a restart whose arena is not in systemd's fd store, how long to wait for a "
          "worker to hand it back before starting empty");
ABSL_FLAG(std::string, crash_at, "",
          "for tests only: SIGKILL kvpoold at STEP:KIND:N (daemon/crash_points.h)");
ABSL_FLAG(bool, allow_nonfinite, false,
          "for tests only: store NaN and Inf in client tensors instead of refusing them");

namespace kvp {
namespace {

template <typename T>
absl::StatusOr<std::vector<T>> ParseIds(const std::string& text, const char* what) {
  std::vector<T> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--", what, ": '", part, "' is not a number"));
    }
    ids.push_back(static_cast<T>(id));
  }
  return ids;
}

// A per-layer flag's values: none (empty), one for every layer, or one per layer.
template <typename T>
absl::StatusOr<std::vector<T>> PerLayer(const std::string& text, int layers, const char* flag) {
  std::vector<T> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    T v;
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtof(absl::StripAsciiWhitespace(part), &v) && std::isfinite(v) && v > 0;
    } else {
      ok = absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v) && v >= 0;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, ": '", part, "' is not a ",
          std::is_floating_point_v<T> ? "finite number > 0" : "whole number >= 0"));
    }
    values.push_back(v);
  }
  if (values.size() == 1) values.assign(layers, values.front());
  if (!values.empty() && static_cast<int>(values.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " has ", values.size(),
                                                   " values for ", layers,
                                                   " layers: give one, or one per layer"));
  }
  return values;
}

absl::StatusOr<PoolSpec> SpecFromFlags() {
  ASSIGN_OR_RETURN(const PoolKind kind, ParsePoolKind(absl::GetFlag(FLAGS_pool_kind)));
  if (kind == PoolKind::kMla) {
    // The latent's format fixes what the K/V flags would say: refuse them rather than ignore them.
    for (const char* name : {"kv_heads", "head_dim", "k_format", "v_format", "v_rotation",
                             "indexer", "k_scales", "v_scales", "sliding_windows"}) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " does not apply to --pool_kind=mla (its latent has one "
                         "format and shape, and it always has the indexer)"));
      }
    }
    PoolSpec spec = MlaPoolSpec(absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_block_size),
                                /*indexer_ue8m0=*/true);
    RETURN_IF_ERROR(ValidatePoolSpec(spec));
    return spec;
  }
  PoolSpec spec;
  spec.num_layers = absl::GetFlag(FLAGS_layers);
  spec.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  spec.block_size = absl::GetFlag(FLAGS_block_size);
  ASSIGN_OR_RETURN(spec.k_format, ParseKvFormat(absl::GetFlag(FLAGS_k_format)));
  ASSIGN_OR_RETURN(spec.v_format, ParseKvFormat(absl::GetFlag(FLAGS_v_format)));
  spec.v_rotation = absl::GetFlag(FLAGS_v_rotation);
  spec.indexer = absl::GetFlag(FLAGS_indexer);
  ASSIGN_OR_RETURN(spec.k_scales,
                   PerLayer<float>(absl::GetFlag(FLAGS_k_scales), spec.num_layers, "k_scales"));
  ASSIGN_OR_RETURN(spec.v_scales,
                   PerLayer<float>(absl::GetFlag(FLAGS_v_scales), spec.num_layers, "v_scales"));
  RETURN_IF_ERROR(ValidatePoolSpec(spec));
  return spec;
}

// The GPUs of a cuda kvpoold's pools: --gpus, else --gpu.
absl::StatusOr<std::vector<int32_t>> GpusFromFlags() {
  ASSIGN_OR_RETURN(std::vector<int32_t> gpus,
                   ParseIds<int32_t>(absl::GetFlag(FLAGS_gpus), "gpus"));
  if (gpus.empty()) gpus.push_back(absl::GetFlag(FLAGS_gpu));
  return gpus;
}

// One arena per pool: on each of --gpus (cuda), or --pools memfd arenas (host). `auto` is cuda
// when the first GPU can be used, else host.
absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> ArenasFromFlags(uint64_t bytes) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto" && backend != "cuda" && backend != "host") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", backend, ": expected auto, cuda or host"));
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> gpus, GpusFromFlags());
  const int host_pools = absl::GetFlag(FLAGS_pools);
  if (host_pools < 1 || host_pools > static_cast<int>(wire::MAX_POOLS) ||
      gpus.size() > wire::MAX_POOLS) {
    return absl::InvalidArgumentError(
        absl::StrCat("kvpoold serves 1 to ", wire::MAX_POOLS, " pools (--pools, --gpus)"));
  }
  std::vector<std::unique_ptr<ServedArena>> arenas;
  if (backend != "host") {
    absl::Status failed;
    for (int gpu : gpus) {
      absl::StatusOr<std::unique_ptr<ServedArena>> arena = CreateCudaServedArena(gpu, bytes);
      if (!arena.ok()) {
        failed = arena.status();
        break;
      }
      arenas.push_back(*std::move(arena));
    }
    if (failed.ok()) {
      if (host_pools != 1) {
        return absl::InvalidArgumentError(
            "--pools is for the host backend; a cuda kvpoold has a pool per --gpus entry");
      }
      return arenas;
    }
    if (backend == "cuda") return failed;
    arenas.clear();
    spdlog::info("no cuda arena ({}); using the host backend", std::string(failed.message()));
  }
  for (int i = 0; i < host_pools; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<ServedArena> arena, CreateHostServedArena(bytes));
    arenas.push_back(std::move(arena));
  }
  return arenas;
}

// The tcp:// endpoint's flags into `options`: all three or none.
absl::Status RemoteEndpointFromFlags(DaemonOptions& options) {
  const std::string endpoint = absl::GetFlag(FLAGS_tcp_endpoint);
  const std::string secret_file = absl::GetFlag(FLAGS_curve_secret_key_file);
  const std::string clients_file = absl::GetFlag(FLAGS_curve_clients_file);
  if (endpoint.empty()) {
    if (!secret_file.empty() || !clients_file.empty()) {
      return absl::InvalidArgumentError("CURVE key files given without --tcp_endpoint");
    }
    return absl::OkStatus();
  }
  if (!absl::StartsWith(endpoint, "tcp://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tcp_endpoint=", endpoint, ": expected tcp://HOST:PORT"));
  }
  const bool peers = !absl::GetFlag(FLAGS_peers_file).empty();
  if (secret_file.empty() || (clients_file.empty() && !peers)) {
    return absl::InvalidArgumentError(
        "--tcp_endpoint needs --curve_secret_key_file and --curve_clients_file (or "
        "--peers_file): remote clients must be authenticated (docs/design.md §8)");
  }
  ASSIGN_OR_RETURN(const std::string secret, ReadCurveKeyFile(secret_file));
  ASSIGN_OR_RETURN(const CurveKeyPair keys, CurveKeyPairFromSecret(secret));
  if (!clients_file.empty()) {
    ASSIGN_OR_RETURN(options.curve_clients, ReadCurveKeyListFile(clients_file));
  }
  if (options.curve_clients.empty() && !peers) {
    return absl::InvalidArgumentError(
        absl::StrCat(clients_file, " lists no client keys: the tcp endpoint would admit nobody"));
  }
  options.tcp_endpoint = endpoint;
  options.curve_secret_key = keys.secret_key;
  spdlog::info("tcp endpoint's CURVE public key (clients need it): {}", keys.public_key);
  return absl::OkStatus();
}

// The GPU of each pool the flags ask for, as a logged state lists them (-1: host); `logged`
// decides for --backend=auto between a host state and a cuda one.
absl::StatusOr<std::vector<int32_t>> AskedGpus(const StateHeader& logged) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  std::vector<int32_t> host(static_cast<size_t>(std::max(absl::GetFlag(FLAGS_pools), 1)), -1);
  ASSIGN_OR_RETURN(std::vector<int32_t> cuda, GpusFromFlags());
  if (backend == "host") return host;
  if (backend == "cuda") return cuda;
  const bool logged_host = std::all_of(logged.pools.begin(), logged.pools.end(),
                                       [](const PoolIdentity& p) { return p.gpu < 0; });
  return logged_host ? host : cuda;
}

absl::Status Main() {
  SteadyClock clock;
  const int64_t started_micros = clock.NowMicros();
  ASSIGN_OR_RETURN(PoolSpec spec, SpecFromFlags());
  const float tau = static_cast<float>(absl::GetFlag(FLAGS_sparse_v_threshold));
  ModelConfig model{.num_q_heads = absl::GetFlag(FLAGS_q_heads),
                    .topk = absl::GetFlag(FLAGS_topk),
                    .synthetic_seed = absl::GetFlag(FLAGS_synthetic_seed),
                    .sliding_windows = {},
                    .sparse_v_threshold = tau,
                    .softmax_scale = static_cast<float>(absl::GetFlag(FLAGS_softmax_scale))};
  ASSIGN_OR_RETURN(model.sliding_windows, PerLayer<int>(absl::GetFlag(FLAGS_sliding_windows),
                                                        spec.num_layers, "sliding_windows"));
  if (std::all_of(model.sliding_windows.begin(), model.sliding_windows.end(),
                  [](int w) { return w == 0; })) {
    model.sliding_windows.clear();  // all zero: no window anywhere
  }
  RETURN_IF_ERROR(ValidateModelConfig(model, spec));
  const int64_t arena_mib = absl::GetFlag(FLAGS_arena_mib);
  if (arena_mib <= 0) return absl::InvalidArgumentError("--arena_mib must be positive");

  std::string runtime_dir = absl::GetFlag(FLAGS_runtime_dir);
  if (runtime_dir.empty()) runtime_dir = DefaultRuntimeDir();
  RETURN_IF_ERROR(PrepareRuntimeDir(runtime_dir));

  DaemonOptions options;
  options.endpoint = absl::GetFlag(FLAGS_endpoint);
  if (options.endpoint.empty()) options.endpoint = EndpointIn(runtime_dir);
  RETURN_IF_ERROR(RemoteEndpointFromFlags(options));
  options.allow.uids.push_back(::geteuid());
  ASSIGN_OR_RETURN(auto uids, ParseIds<uid_t>(absl::GetFlag(FLAGS_allow_uids), "allow_uids"));
  ASSIGN_OR_RETURN(options.allow.gids,
                   ParseIds<gid_t>(absl::GetFlag(FLAGS_allow_gids), "allow_gids"));
  options.allow.uids.insert(options.allow.uids.end(), uids.begin(), uids.end());
  options.metrics_host = absl::GetFlag(FLAGS_metrics_address);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.drain_timeout_millis = absl::GetFlag(FLAGS_drain_timeout_ms);

  // With a state directory, the arenas of the last run come back from systemd's fd store and
  // their bookkeeping from the state log, unless anything differs (docs/design.md §10).
  const uint64_t arena_bytes_asked = static_cast<uint64_t>(arena_mib) << 20;
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  ASSIGN_OR_RETURN(CrashPoint crash, CrashPoint::Parse(absl::GetFlag(FLAGS_crash_at)));
  FdStore fd_store = FdStore::FromEnvironment();
  ASSIGN_OR_RETURN(const BlockLayout layout, BlockLayout::Create(spec));
  std::optional<RecoveredState> recovered;
  std::string starts_empty_because;
  if (!state_dir.empty()) {
    RETURN_IF_ERROR(PrepareRuntimeDir(state_dir));
    absl::StatusOr<RecoveredState> read = ReadStateLog(state_dir);
    if (read.ok()) {
      recovered = *std::move(read);
    } else if (!absl::IsNotFound(read.status())) {
      starts_empty_because = read.status().ToString();
    }
  }
  std::vector<std::unique_ptr<ServedArena>> arenas;
  std::vector<PoolIdentity> pool_ids;
  std::vector<size_t> handed_back;  // pools whose chunks came from workers, not the fd store
  if (recovered.has_value()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> asked_gpus, AskedGpus(recovered->header));
    const PoolsAsked asked{.spec = spec,
                           .block_stride = layout.block_stride(),
                           .gpus = std::move(asked_gpus),
                           .arena_bytes = arena_bytes_asked};
    absl::StatusOr<std::vector<std::unique_ptr<ServedArena>>> adopted =
        absl::FailedPreconditionError("not adopted");
    if (absl::Status same = CheckLoggedPools(recovered->header, asked); !same.ok()) {
      adopted = same;
    } else {
      // From the fd store, else from the workers that still map the arena.
      auto chunks = TakeStoredChunks(recovered->header, fd_store);
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (!chunks[i].has_value()) handed_back.push_back(i);
      }
      AwaitHandBack(recovered->header, ReturnChannelIn(runtime_dir), options.allow,
                    absl::GetFlag(FLAGS_recovery_wait_ms), chunks);
      adopted = AdoptArenas(recovered->header, std::move(chunks));
    }
    if (adopted.ok()) {
      arenas = *std::move(adopted);
      pool_ids = recovered->header.pools;
      if (!handed_back.empty() && fd_store.available()) {
        RETURN_IF_ERROR(StoreArenas(arenas, pool_ids, fd_store, handed_back));
      }
    } else {
      starts_empty_because = std::string(adopted.status().message());
      recovered.reset();
    }
  }
  if (arenas.empty()) {
    ASSIGN_OR_RETURN(arenas, ArenasFromFlags(arena_bytes_asked));
  }
  fd_store.RemoveUntaken();  // chunks of arenas that are no more
  // Every pool has the same size (the smallest arena's, should rounding differ).
  uint64_t arena_bytes = UINT64_MAX;
  for (const auto& arena : arenas) {
    uint64_t bytes = 0;
    for (uint64_t c : arena->chunk_sizes()) bytes += c;
    arena_bytes = std::min(arena_bytes, bytes);
  }
  const int64_t lease_expiry = int64_t{absl::GetFlag(FLAGS_lease_expiry_ms)} * 1000;
  ASSIGN_OR_RETURN(std::unique_ptr<PoolSet> pools,
                   PoolSet::Create(spec, arena_bytes, static_cast<int>(arenas.size()), &clock,
                                   lease_expiry));
  if (pool_ids.empty()) {
    pool_ids = NewPoolIdentities(arenas, pools->pool(0).blocks().num_blocks());
    if (!state_dir.empty() && fd_store.available()) {
      RETURN_IF_ERROR(StoreArenas(arenas, pool_ids, fd_store));
    } else if (!state_dir.empty()) {
      spdlog::warn("no fd store (NOTIFY_SOCKET is not set: not under systemd): a restart gets "
                   "the arena back only from workers that still map it");
    }
  }
  const ContentDigester::Key digest_key =
      recovered.has_value() ? recovered->header.digest_key : ContentDigester().key();
  RestoredPools restored;
  bool resume_log = false;
  const uint64_t logged_bytes = recovered.has_value() ? recovered->valid_bytes : 0;
  if (recovered.has_value()) {
    absl::StatusOr<RestoredPools> r =
        RestorePools(*std::move(recovered), *pools,
                     int64_t{absl::GetFlag(FLAGS_recovery_grace_ms)} * 1000,
                     int64_t{absl::GetFlag(FLAGS_recovery_quarantine_ms)} * 1000);
    if (r.ok()) {
      restored = *std::move(r);
      resume_log = true;
    } else {
      starts_empty_because = r.status().ToString();
    }
  }
  if (!starts_empty_because.empty()) {
    spdlog::warn("starting with an empty cache: {}", starts_empty_because);
  }
  std::unique_ptr<StateLog> state_log;
  if (!state_dir.empty()) {
    StateHeader header{.spec = spec,
                       .block_stride = layout.block_stride(),
                       .pools = pool_ids,
                       .digest_key = digest_key,
                       .arena_bytes = arena_bytes_asked};
    // A recovered log is continued (rewriting it would delay serving); compaction comes later.
    if (resume_log) {
      ASSIGN_OR_RETURN(state_log, StateLog::Resume(state_dir, std::move(header), pools.get(),
                                                   logged_bytes, restored.old_workers));
    } else {
      ASSIGN_OR_RETURN(state_log, StateLog::Start(state_dir, std::move(header), pools.get()));
    }
  }

  BrokerOptions broker_options;
  broker_options.model = model;
  broker_options.pool_gpus.clear();
  broker_options.fd_channel_paths.clear();
  std::vector<const ServedArena*> served;
  for (size_t i = 0; i < arenas.size(); ++i) {
    broker_options.pool_gpus.push_back(arenas[i]->device());
    broker_options.fd_channel_paths.push_back(FdChannelIn(runtime_dir, static_cast<int>(i)));
    broker_options.pool_chunk_bytes.push_back(arenas[i]->chunk_sizes().at(0));
    served.push_back(arenas[i].get());
  }
  if (const std::string transport = absl::GetFlag(FLAGS_transport); transport != "auto") {
    broker_options.transport = TransportNamed(transport);
    if (!broker_options.transport.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--transport=", transport, ": expected auto, host, peer_copy, nccl or socket"));
    }
  }
  broker_options.transfer_timeout_millis = absl::GetFlag(FLAGS_transfer_timeout_ms);
  if (broker_options.transfer_timeout_millis <= 0) {
    return absl::InvalidArgumentError("--transfer_timeout_ms must be positive");
  }
  // Slices pay where writing a slice takes longer than moving its blocks: host pools. On an
  // H200 a slice's job round trip costs the reply more than the move it hides (docs/benchmarks.md,
  // "Streamed prefills"), so cuda pools slice only when a request asks.
  constexpr int kHostPrefillChunkTokens = 8192;
  broker_options.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  if (broker_options.prefill_chunk_tokens < -1) {
    return absl::InvalidArgumentError(
        "--prefill_chunk_tokens must be -1 (by backend), 0 (whole) or positive");
  }
  if (broker_options.prefill_chunk_tokens == -1) {
    broker_options.prefill_chunk_tokens =
        broker_options.pool_gpus.front() < 0 ? kHostPrefillChunkTokens : 0;
  }
  broker_options.heartbeat_millis = absl::GetFlag(FLAGS_heartbeat_ms);
  broker_options.worker_lease_micros = lease_expiry;
  broker_options.client_lease_micros = int64_t{absl::GetFlag(FLAGS_client_lease_ms)} * 1000;
  broker_options.epoch = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch() / std::chrono::microseconds(1));
  broker_options.max_job_attempts = absl::GetFlag(FLAGS_max_job_attempts);
  const int64_t max_blocks = absl::GetFlag(FLAGS_client_max_blocks);
  if (max_blocks < -1) return absl::InvalidArgumentError("--client_max_blocks must be >= -1");
  // By default one client may use most of otherwise idle pools, but not all of them.
  const int64_t pool_blocks = pools->pool(0).blocks().num_blocks();
  const int64_t all_blocks = pool_blocks * static_cast<int64_t>(pools->size());
  broker_options.client_max_blocks =
      max_blocks == -1 ? std::max<int64_t>(1, all_blocks * 9 / 10) : max_blocks;
  broker_options.client_max_requests = absl::GetFlag(FLAGS_client_max_requests);
  if (broker_options.client_max_requests < 1) {
    return absl::InvalidArgumentError("--client_max_requests must be at least 1");
  }
  broker_options.allow_nonfinite = absl::GetFlag(FLAGS_allow_nonfinite);
  broker_options.digest_key = digest_key;
  broker_options.node_name = absl::GetFlag(FLAGS_node_name);
  if (const std::string peers_file = absl::GetFlag(FLAGS_peers_file); !peers_file.empty()) {
    RETURN_IF_ERROR(CheckNodeName(broker_options.node_name));
    if (options.tcp_endpoint.empty()) {
      return absl::InvalidArgumentError(
          "--peers_file needs --tcp_endpoint: the other nodes' kvpoolds connect to it");
    }
    ASSIGN_OR_RETURN(broker_options.peers, ReadPeersFile(peers_file, broker_options.node_name));
    spdlog::info("node {}: {} peers from {}", broker_options.node_name,
                 broker_options.peers.size(), peers_file);
  } else if (!broker_options.node_name.empty()) {
    RETURN_IF_ERROR(CheckNodeName(broker_options.node_name));
  }
  broker_options.limits.max_layers = static_cast<uint64_t>(spec.num_layers);
  broker_options.limits.max_blocks = static_cast<uint64_t>(pool_blocks);
  broker_options.limits.max_message_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_message_mib)) << 20;
  if (broker_options.heartbeat_millis <= 0 || lease_expiry <= broker_options.heartbeat_millis * 1000) {
    return absl::InvalidArgumentError("--lease_expiry_ms must exceed --heartbeat_ms > 0");
  }
  Broker broker(pools.get(), &clock, broker_options);
  if (restored.quarantine != 0) broker.SetQuarantine(restored.quarantine, restored.pids);
  const int64_t recovery_micros = clock.NowMicros() - started_micros;
  if (!state_dir.empty()) {
    broker.set_recovered({.sequences = restored.sequences,
                          .blocks = restored.blocks,
                          .micros = static_cast<uint64_t>(recovery_micros)});
    spdlog::info("state dir {}: recovered {} sequences and {} blocks, {} ms after start",
                 state_dir, restored.sequences, restored.blocks, recovery_micros / 1000);
  }
  for (const PoolIdentity& id : pool_ids) options.arena_ids.push_back(id.id);
  DaemonLoop loop(options, std::move(served), pools.get(), &broker, &clock, state_log.get(),
                  &crash);
  return loop.Run();
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  // Before any thread exists: threads inherit the mask, and the CUDA runtime starts threads when
  // the arena is made, long before the loop's signalfd reads SIGTERM; a thread that did not block
  // it would take the default action and kill kvpoold instead of letting it drain.
  sigset_t termination;
  sigemptyset(&termination);
  sigaddset(&termination, SIGTERM);
  sigaddset(&termination, SIGINT);
  pthread_sigmask(SIG_BLOCK, &termination, nullptr);
  absl::SetProgramUsageMessage(
      "kvpoold: the kvpool daemon. Owns the KV-cache arena and brokers prefill and decode jobs.\n"
      "Example: kvpoold --backend=host --arena_mib=512 --layers=4");
  kvp::KeepFreedMemoryForReuse();
  std::vector<std::string> storage;
  if (auto args = kvp::ParseCommandLineWithFlagFiles(argc, argv, storage); !args.ok()) {
    std::fprintf(stderr, "kvpoold: %s\n", args.status().ToString().c_str());
    return 2;
  }
  kvp::InstallLogger("kvpoold");
  const absl::Status status = kvp::Main();
  if (!status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  return 0;
}
