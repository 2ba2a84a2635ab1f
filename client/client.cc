#include "client/client.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "protocol/endpoints.h"
#include "protocol/lists.h"
#include "protocol/status_codec.h"

namespace kvp {
namespace {

ClientOptions WithDefaults(ClientOptions o) {
  if (o.endpoint.empty()) o.endpoint = EndpointIn(DefaultRuntimeDir());
  if (o.name.empty()) {
    static std::atomic<int> counter = 0;
    o.name = absl::StrCat("client-", ::getpid(), "-", counter++);
  }
  return o;
}

absl::Status ErrorOr(const ParsedEnvelope& reply) {
  const auto body = reply.envelope().getBody();
  return body.isError() ? StatusFromWire(body.getError()) : absl::OkStatus();
}

absl::Status Unexpected(const char* what) {
  return absl::InternalError(absl::StrCat("kvpoold answered a ", what, " with another kind"));
}

std::vector<PoolState> PoolStatesFromWire(capnp::List<wire::PoolState>::Reader list) {
  std::vector<PoolState> pools;
  for (auto p : list) {
    pools.push_back({.index = p.getIndex(),
                     .gpu = p.getGpu(),
                     .blocks_free = p.getBlocksFree(),
                     .blocks_reserved = p.getBlocksReserved(),
                     .blocks_used = p.getBlocksUsed(),
                     .blocks_cached = p.getBlocksCached(),
                     .sequences = p.getSequences(),
                     .prefill_workers = p.getPrefillWorkers(),
                     .decode_workers = p.getDecodeWorkers()});
  }
  return pools;
}

}  // namespace

absl::StatusOr<PoolAddress> ParsePoolAddress(absl::string_view text) {
  PoolAddress address;
  absl::string_view pool = text;
  if (const size_t slash = text.find('/'); slash != absl::string_view::npos) {
    address.node = std::string(text.substr(0, slash));
    pool = text.substr(slash + 1);
    if (address.node.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("pool '", text, "': a node before the /"));
    }
  }
  if (!absl::SimpleAtoi(pool, &address.pool) || address.pool < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", text, "': expected POOL or NODE/POOL, POOL a number from 0"));
  }
  return address;
}

namespace {

MigrationResult MigrationFromWire(wire::MigrationReport::Reader m) {
  MigrationResult r{.from_pool = m.getFromPool(),
                    .to_pool = m.getToPool(),
                    .to_node = m.getToNode().cStr(),
                    .transport = m.getTransport(),
                    .blocks_moved = m.getBlocksMoved(),
                    .blocks_shared = m.getBlocksShared(),
                    .bytes = m.getBytes(),
                    .micros = m.getMicros(),
                    .streamed_blocks = m.getStreamedBlocks(),
                    .after_prefill_micros = m.getAfterPrefillMicros(),
                    .length = 0,
                    .error = absl::OkStatus()};
  if (m.hasError()) {
    r.error = StatusFromWire(m.getError());
    if (r.error.ok()) r.error = absl::UnknownError("kvpoold reported a failed move with code OK");
  }
  return r;
}

}  // namespace

Client::Client(ClientOptions options)
    : options_(WithDefaults(std::move(options))),
      context_(1),
      dealer_(context_, options_.endpoint, options_.name,
              options_.curve.has_value() ? &*options_.curve : nullptr) {
  dealer_.set_keep_alive_ms(options_.keep_alive_ms);
}

absl::StatusOr<std::unique_ptr<ParsedEnvelope>> Client::Call(const EnvelopeBuilder& request) {
  return dealer_.Call(request, options_.timeout_ms);
}

absl::StatusOr<PoolHealth> Client::Health() {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initHealth();
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isHealthReply()) return Unexpected("health request");
  const auto h = body.getHealthReply();
  PoolHealth health;
  health.ready = h.getReady();
  health.draining = h.getDraining();
  health.epoch = h.getEpoch();
  health.workers = h.getWorkers();
  ASSIGN_OR_RETURN(health.spec, PoolSpecFromWire(h.getSpec()));
  health.model = ModelConfigFromWire(h.getModel());
  health.client_max_blocks = h.getLimits().getMaxBlocks();
  health.client_max_requests = h.getLimits().getMaxRequestsInFlight();
  health.pools = PoolStatesFromWire(h.getPools());
  return health;
}

absl::StatusOr<PoolStats> Client::Stats() {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initStats();
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isStatsReply()) return Unexpected("stats request");
  const auto s = body.getStatsReply();
  PoolStats stats{.blocks_free = s.getBlocksFree(),
                   .blocks_reserved = s.getBlocksReserved(),
                   .blocks_used = s.getBlocksUsed(),
                   .blocks_cached = s.getBlocksCached(),
                   .prefix_hit_blocks = s.getPrefixHitBlocks(),
                   .leases = s.getLeases(),
                   .sequences = s.getSequences(),
                   .client_blocks = s.getClientBlocks(),
                   .client_requests_in_flight = s.getClientRequestsInFlight(),
                   .rejected_nonfinite = s.getRejectedNonFinite(),
                   .pools = PoolStatesFromWire(s.getPools()),
                   .recovery = {.state_dir = s.getRecovery().getStateDir(),
                                .sequences = s.getRecovery().getSequences(),
                                .blocks = s.getRecovery().getBlocks(),
                                .micros = s.getRecovery().getMicros()},
                   .peers = {},
                   .remote_sequences = {}};
  for (auto p : s.getPeers()) {
    stats.peers.push_back({.name = p.getName().cStr(),
                           .endpoint = p.getEndpoint().cStr(),
                           .reachable = p.getReachable(),
                           .last_heard_millis = p.getLastHeardMillis(),
                           .sequences = p.getSequences()});
  }
  for (auto r : s.getRemoteSequences()) {
    stats.remote_sequences.push_back(
        {.sequence = r.getSequence(), .node = r.getNode().cStr(), .pool = r.getPool()});
  }
  return stats;
}

absl::Status Client::Heartbeat() {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initHeartbeat().setLease(0);
  return Call(request).status();
}

void Client::BuildPrefill(EnvelopeBuilder& request, uint64_t sequence,
                          std::span<const int32_t> tokens, const TokenActivations* activations,
                          const PoolSpec* spec, const std::string& cache_namespace,
                          Placement placement) {
  auto p = request.envelope().getBody().initPrefill();
  p.setSequence(sequence);
  p.setPool(placement.pool);
  p.setDecodePool(placement.decode_pool);
  p.setDecodeNode(placement.decode_node);
  p.setChunkTokens(placement.chunk_tokens);
  p.setContinued(placement.continued);
  p.setCacheNamespace(cache_namespace);
  FillList(p.initTokens(tokens.size()), tokens);
  if (activations != nullptr) {
    ActivationsToWire(*activations, *spec, static_cast<uint32_t>(tokens.size()),
                      p.initActivations());
  }
}

void Client::BuildDecode(EnvelopeBuilder& request, const std::vector<DecodeStepRequest>& steps,
                         wire::OutputLayers outputs, const PoolSpec* spec,
                         const ModelConfig* model) {
  auto d = request.envelope().getBody().initDecode();
  d.setOutputLayers(outputs);
  auto list = d.initSteps(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const DecodeStepRequest& s = steps[i];
    auto w = list[i];
    w.setSequence(s.sequence);
    w.setToken(s.token);
    if (s.needle.has_value()) {
      auto n = w.initNeedle();
      n.setPosition(static_cast<uint64_t>(s.needle->position));
      n.setToken(s.needle->token);
      n.setGain(s.needle->gain);
    }
    if (s.activations != nullptr) ActivationsToWire(*s.activations, *spec, 1, w.initActivations());
    if (s.queries != nullptr) QueriesToWire(*s.queries, *spec, *model, w.initQueries());
  }
}

absl::StatusOr<PrefillResult> PrefillResultOf(const ParsedEnvelope& reply) {
  RETURN_IF_ERROR(ErrorOr(reply));
  const auto body = reply.envelope().getBody();
  if (!body.isPrefillReply()) return Unexpected("prefill");
  const auto p = body.getPrefillReply();
  PrefillResult result{.length = static_cast<int64_t>(p.getLength()),
                       .prefix_hit_tokens = static_cast<int32_t>(p.getPrefixHitTokens()),
                       .pool = p.getPool(),
                       .node = p.getNode().cStr(),
                       .migration = std::nullopt};
  if (p.hasMigration()) result.migration = MigrationFromWire(p.getMigration());
  return result;
}

absl::StatusOr<MigrationResult> MigrationResultOf(const ParsedEnvelope& reply) {
  RETURN_IF_ERROR(ErrorOr(reply));
  const auto body = reply.envelope().getBody();
  if (!body.isMigrateReply()) return Unexpected("migrate");
  MigrationResult result = MigrationFromWire(body.getMigrateReply().getMigration());
  result.length = static_cast<int64_t>(body.getMigrateReply().getLength());
  return result;
}

absl::StatusOr<DecodeResult> DecodeResultOf(const ParsedEnvelope& reply) {
  RETURN_IF_ERROR(ErrorOr(reply));
  const auto body = reply.envelope().getBody();
  if (!body.isDecodeReply()) return Unexpected("decode");
  DecodeResult result;
  ASSIGN_OR_RETURN(result.steps, DecodeResultsFromWire(body.getDecodeReply().getOutputs()));
  result.worker_micros = body.getDecodeReply().getWorkerMicros();
  result.worker_handle_micros = body.getDecodeReply().getWorkerHandleMicros();
  result.broker_micros = body.getDecodeReply().getBrokerMicros();
  return result;
}

absl::StatusOr<PrefillResult> Client::Prefill(uint64_t sequence, std::span<const int32_t> tokens,
                                              const TokenActivations* activations,
                                              const PoolSpec* spec, Placement placement) {
  EnvelopeBuilder request = NewRequest();
  BuildPrefill(request, sequence, tokens, activations, spec, options_.cache_namespace, placement);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  return PrefillResultOf(*reply);
}

absl::StatusOr<MigrationResult> Client::Migrate(uint64_t sequence, uint32_t to_pool,
                                                const std::string& to_node) {
  EnvelopeBuilder request = NewRequest();
  auto m = request.envelope().getBody().initMigrate();
  m.setSequence(sequence);
  m.setToPool(to_pool);
  m.setToNode(to_node);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  return MigrationResultOf(*reply);
}

absl::StatusOr<DecodeResult> Client::Decode(const std::vector<DecodeStepRequest>& steps,
                                            wire::OutputLayers outputs, const PoolSpec* spec,
                                            const ModelConfig* model) {
  EnvelopeBuilder request = NewRequest();
  BuildDecode(request, steps, outputs, spec, model);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  return DecodeResultOf(*reply);
}

absl::StatusOr<uint32_t> Client::Release(uint64_t sequence) {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initRelease().setSequence(sequence);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isReleaseReply()) return Unexpected("release");
  return body.getReleaseReply().getReleasedBlocks();
}

absl::StatusOr<uint32_t> Client::Fork(uint64_t source, uint64_t target) {
  EnvelopeBuilder request = NewRequest();
  auto f = request.envelope().getBody().initFork();
  f.setSource(source);
  f.setTarget(target);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isForkReply()) return Unexpected("fork");
  return body.getForkReply().getSharedBlocks();
}

absl::StatusOr<AppendResult> Client::Append(uint64_t sequence, std::span<const int32_t> tokens,
                                            int32_t pool) {
  EnvelopeBuilder request = NewRequest();
  auto a = request.envelope().getBody().initAppend();
  a.setSequence(sequence);
  a.setPool(pool);
  a.setCacheNamespace(options_.cache_namespace);
  FillList(a.initTokens(tokens.size()), tokens);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isAppendReply()) return Unexpected("append");
  const auto r = body.getAppendReply();
  AppendResult result;
  result.prefix_hit_tokens = static_cast<int32_t>(r.getPrefixHitTokens());
  result.slots = ListToVector<int64_t>(r.getSlots());
  for (auto c : r.getCopies()) result.copies.emplace_back(c.getSource(), c.getTarget());
  result.block_table = ListToVector<int32_t>(r.getBlockTable());
  result.pool = r.getPool();
  return result;
}

absl::StatusOr<int64_t> Client::Commit(uint64_t sequence) {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initCommit().setSequence(sequence);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isCommitReply()) return Unexpected("commit");
  return static_cast<int64_t>(body.getCommitReply().getLength());
}

absl::StatusOr<int64_t> Client::Abort(uint64_t sequence) {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initAbort().setSequence(sequence);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isAbortReply()) return Unexpected("abort");
  return static_cast<int64_t>(body.getAbortReply().getLength());
}

}  // namespace kvp
