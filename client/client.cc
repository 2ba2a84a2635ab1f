#include "client/client.h"

#include <unistd.h>

#include <atomic>

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
  return health;
}

absl::StatusOr<PoolStats> Client::Stats() {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initStats();
  ASSIGN_OR_RETURN(auto reply, Call(request));
  const auto body = reply->envelope().getBody();
  if (!body.isStatsReply()) return Unexpected("stats request");
  const auto s = body.getStatsReply();
  return PoolStats{.blocks_free = s.getBlocksFree(),
                   .blocks_reserved = s.getBlocksReserved(),
                   .blocks_used = s.getBlocksUsed(),
                   .blocks_cached = s.getBlocksCached(),
                   .prefix_hit_blocks = s.getPrefixHitBlocks(),
                   .leases = s.getLeases(),
                   .sequences = s.getSequences(),
                   .client_blocks = s.getClientBlocks(),
                   .client_requests_in_flight = s.getClientRequestsInFlight(),
                   .rejected_nonfinite = s.getRejectedNonFinite()};
}

absl::Status Client::Heartbeat() {
  EnvelopeBuilder request = NewRequest();
  request.envelope().getBody().initHeartbeat().setLease(0);
  return Call(request).status();
}

void Client::BuildPrefill(EnvelopeBuilder& request, uint64_t sequence,
                          std::span<const int32_t> tokens, const TokenActivations* activations,
                          const PoolSpec* spec, const std::string& cache_namespace) {
  auto p = request.envelope().getBody().initPrefill();
  p.setSequence(sequence);
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
  return PrefillResult{static_cast<int64_t>(body.getPrefillReply().getLength()),
                       static_cast<int32_t>(body.getPrefillReply().getPrefixHitTokens())};
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
                                              const PoolSpec* spec) {
  EnvelopeBuilder request = NewRequest();
  BuildPrefill(request, sequence, tokens, activations, spec, options_.cache_namespace);
  ASSIGN_OR_RETURN(auto reply, Call(request));
  return PrefillResultOf(*reply);
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

absl::StatusOr<AppendResult> Client::Append(uint64_t sequence, std::span<const int32_t> tokens) {
  EnvelopeBuilder request = NewRequest();
  auto a = request.envelope().getBody().initAppend();
  a.setSequence(sequence);
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
