#include "tests/fuzz/fuzz_service.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/capabilities.h"
#include "protocol/capabilities_codec.h"
#include "protocol/framing.h"

namespace kvp::fuzz {

PoolSpec FuzzPoolSpec() {
  PoolSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.indexer = true;
  return spec;
}

ModelConfig FuzzModel() {
  ModelConfig model;
  model.num_q_heads = 4;
  model.topk = 32;
  return model;
}

FuzzService::FuzzService(std::optional<wire::Transport> transport, bool peers) {
  spdlog::set_level(spdlog::level::off);  // millions of inputs: the broker's log lines are noise
  const PoolSpec spec = FuzzPoolSpec();
  const uint64_t stride = static_cast<uint64_t>(BlockLayout::Create(spec)->block_stride());
  pools_ = PoolSet::Create(spec, kFuzzBlocks * stride, kFuzzPools, &clock_, 3'000'000).value();
  BrokerOptions options;
  options.model = FuzzModel();
  options.epoch = 77;
  options.client_max_blocks = kFuzzBlocks * 3 / 4;
  options.client_max_requests = 4;
  options.limits.max_layers = static_cast<uint64_t>(spec.num_layers);
  options.limits.max_blocks = kFuzzBlocks;
  options.limits.max_message_bytes = 1 << 20;
  options.pool_gpus.assign(kFuzzPools, -1);
  options.fd_channel_paths = {"/nonexistent/fd-0", "/nonexistent/fd-1"};
  options.transport = transport;
  if (peers) {
    options.node_name = std::string(1, 'a');  // not = "a": g++ 12 -Wrestrict misfires
    options.peers = {PeerNode{.name = "b", .endpoint = "tcp://127.0.0.1:9", .public_key = {},
                              .raw_key = {}}};
  }
  broker_ = std::make_unique<Broker>(pools_.get(), &clock_, options);
}

Outbox FuzzService::Send(const std::string& from, std::vector<zmq::message_t> frames) {
  Outbox out;
  broker_->Handle(from, std::move(frames), out);
  return out;
}

Outbox FuzzService::Send(const std::string& from, const EnvelopeBuilder& message) {
  return Send(from, message.Frame());
}

Outbox FuzzService::Tick(int64_t advance_micros) {
  clock_.Advance(advance_micros);
  Outbox out;
  broker_->Tick(out);
  return out;
}

Outbox FuzzService::Register(const std::string& identity, wire::Role role, int32_t pool) {
  EnvelopeBuilder m(1);
  auto r = m.envelope().getBody().initRegister();
  r.setRole(role);
  r.setPool(pool);
  const BackendCapabilities& kernels = kHostCapabilities;
  ServedToWire(role == wire::Role::PREFILL ? kernels.cache_write : kernels.Decode(),
               r.initCapabilities().initHostArena());
  return Send(identity, m);
}

std::vector<std::unique_ptr<ParsedEnvelope>> Replies(Outbox& out, const std::string& to) {
  std::vector<std::unique_ptr<ParsedEnvelope>> parsed;
  for (Outgoing& o : out) {
    if (!to.empty() && o.to != to) continue;
    absl::StatusOr<std::unique_ptr<ParsedEnvelope>> p = ParseEnvelope(std::move(o.frames));
    CheckOrDie(p.status(), "kvpoold sent a message that does not parse");
    parsed.push_back(std::move(*p));
  }
  return parsed;
}

EnvelopeBuilder SyntheticPrefill(uint64_t id, uint64_t seq, int tokens, int32_t first) {
  EnvelopeBuilder m(id);
  auto p = m.envelope().getBody().initPrefill();
  p.setSequence(seq);
  auto t = p.initTokens(tokens);
  for (int i = 0; i < tokens; ++i) t.set(i, first + i);
  return m;
}

std::vector<zmq::message_t> FramesOf(const std::string& bytes, int segments) {
  std::vector<zmq::message_t> frames;
  const size_t per = segments <= 1 ? bytes.size() : (bytes.size() / segments + 7) / 8 * 8;
  size_t at = 0;
  for (int i = 0; i < segments && at < bytes.size(); ++i) {
    const size_t n = i + 1 == segments ? bytes.size() - at : std::min(per, bytes.size() - at);
    frames.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (frames.empty()) frames.emplace_back();
  return frames;
}

void CheckOrDie(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::abort();
}

}  // namespace kvp::fuzz
