// The driver of the broker fuzz targets: random sequences of well-formed requests from several
// clients and workers into kvpoold's broker (prefill with and without tensors, decode, engine
// append/commit/abort, fork, release, migrations between two pools (host copies, or paired
// socket moves with their TransferReady), heartbeats, worker register/done/failed, the clock
// running out leases), checking the pools' invariants after every step: no block lost, none owned
// twice, reference counts equal to the sequence tables, one home per sequence, every message
// kvpoold sends well formed. With peers it also plays kvpoold's peer node b: b's imports and its
// requests as a client, and b's answers (honest or not) to the moves and the forwarded calls
// kvpoold sends it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/activations_codec.h"
#include "protocol/lists.h"
#include "protocol/spec_codec.h"
#include "protocol/status_codec.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_service.h"

namespace kvp::fuzz {

inline constexpr const char* kClients[] = {"ipc/c0", "ipc/c1", "tcp/c2"};
inline constexpr int kNumWorkers = 4;
inline constexpr const char* kWorkers[] = {"ipc/prefill-0", "ipc/decode-0", "ipc/prefill-1",
                                           "ipc/decode-1"};
inline constexpr wire::Role kWorkerRoles[] = {wire::Role::PREFILL, wire::Role::DECODE,
                                              wire::Role::PREFILL, wire::Role::DECODE};
inline constexpr int32_t kWorkerPools[] = {0, 0, 1, 1};
inline constexpr const char* kNamespaces[] = {"", "tenant-a"};
// Node b, as kvpoold sees it: its kvpoold on the tcp endpoint, and kvpoold's own link to it.
inline constexpr const char* kPeer = "peer/b/r";
inline constexpr const char* kLink = "link/b";
inline constexpr uint32_t kPeerSteps = 4;  // the choices Step has only with peers

struct PendingJob {
  std::string worker;
  uint64_t job = 0;
  uint32_t steps = 0;  // decode jobs: outputs a report must carry
};

class Driver {
 public:
  // `peers`: kvpoold is node "a" with node "b" as its peer, and Step also plays b (kPeerSteps).
  Driver(FuzzInput& in, std::optional<wire::Transport> transport, bool peers)
      : in_(in), service_(transport, peers), peers_(peers) {}

  void Step() {
    const std::string client = kClients[in_.Below(3)];
    const uint64_t seq = in_.Below(6);
    uint64_t id = next_id_++;
    // Without peers the choices are those the corpus was written for.
    switch (in_.Below(peers_ ? 15 + kPeerSteps : 15)) {
      case 0:
        Deliver(client, Prefill(id, seq));
        break;
      case 1:
        Deliver(client, Decode(id));
        break;
      case 2:
        Deliver(client, Append(id, seq));
        break;
      case 3: {
        EnvelopeBuilder m(id);
        m.envelope().getBody().initCommit().setSequence(seq);
        Deliver(client, m);
        break;
      }
      case 4: {
        EnvelopeBuilder m(id);
        m.envelope().getBody().initAbort().setSequence(seq);
        Deliver(client, m);
        break;
      }
      case 5: {
        EnvelopeBuilder m(id);
        m.envelope().getBody().initRelease().setSequence(seq);
        Deliver(client, m);
        break;
      }
      case 6: {
        EnvelopeBuilder m(id);
        auto f = m.envelope().getBody().initFork();
        f.setSource(seq);
        f.setTarget(in_.Below(6));
        Deliver(client, m);
        break;
      }
      case 7: {
        EnvelopeBuilder m(id);
        if (in_.Bit()) {
          m.envelope().getBody().initStats();
        } else {
          m.envelope().getBody().initHeartbeat().setLease(0);
        }
        Deliver(client, m);
        break;
      }
      case 8: {
        const int w = static_cast<int>(in_.Below(kNumWorkers));
        Collect(service_.Register(kWorkers[w], kWorkerRoles[w], kWorkerPools[w]));
        break;
      }
      case 9:
      case 10:
        Report(/*failed=*/in_.Below(4) == 0);
        break;
      case 11:
        Collect(service_.Tick(static_cast<int64_t>(in_.Below(8)) * 500'000));
        break;
      case 13: {  // to pool 0, 1, or one that does not exist
        EnvelopeBuilder m(id);
        auto r = m.envelope().getBody().initMigrate();
        r.setSequence(seq);
        r.setToPool(in_.Below(3));
        Deliver(client, m);
        break;
      }
      case 14: {  // a worker opened a paired move's link (or says so for another job)
        if (jobs_.empty()) break;
        const PendingJob& job = jobs_[in_.Below(static_cast<uint32_t>(jobs_.size()))];
        EnvelopeBuilder m(id);
        auto r = m.envelope().getBody().initTransferReady();
        r.setJob(in_.Bit() ? job.job : job.job + 1);
        const std::string rendezvous = "127.0.0.1:9";
        r.setRendezvous(
            kj::arrayPtr(reinterpret_cast<const kj::byte*>(rendezvous.data()), rendezvous.size()));
        Deliver(job.worker, m);
        break;
      }
      case 15:
        PeerImport(id);
        break;
      case 16: {  // to node b, or to one that is not a peer
        EnvelopeBuilder m(id);
        auto r = m.envelope().getBody().initMigrate();
        r.setSequence(seq);
        r.setToPool(in_.Below(3));
        r.setToNode(in_.Below(4) == 0 ? "c" : "b");
        Deliver(client, m);
        break;
      }
      case 17:
        AnswerOnLink();
        break;
      case 18:
        PeerAsClient(id);
        break;
      case 12: {  // a worker's heartbeat keeps it alive while the clock runs
        const int w = static_cast<int>(in_.Below(kNumWorkers));
        if (auto it = leases_.find(kWorkers[w]); it != leases_.end()) {
          EnvelopeBuilder m(id);
          auto h = m.envelope().getBody().initHeartbeat();
          h.setLease(it->second);
          h.setEpoch(77);
          Deliver(kWorkers[w], m);
        }
        break;
      }
    }
    CheckOrDie(service_.Check(), "pool invariants");
  }

  void Finish() {
    Collect(service_.Tick(60'000'000));  // every lease expires
    CheckOrDie(service_.Check(), "pool invariants after every lease expired");
    // Jobs still in flight keep their blocks until they end: end them all.
    while (!jobs_.empty()) Report(true);
    Collect(service_.Tick(60'000'000));
    const PoolCounts c = service_.pools().counts();
    if (c.reserved != 0 || c.used != 0) {
      CheckOrDie(absl::InternalError(absl::StrCat(c.reserved, " reserved and ", c.used,
                                                  " used blocks after every lease ended")),
                 "leak");
    }
  }

 private:
  EnvelopeBuilder Prefill(uint64_t id, uint64_t seq) {
    const int tokens = 1 + static_cast<int>(in_.Below(70));
    const int32_t first = static_cast<int32_t>(in_.Below(3)) * 16;  // shared prefixes are likely
    EnvelopeBuilder m = SyntheticPrefill(id, seq, tokens, first);
    auto p = m.envelope().getBody().getPrefill();
    p.setCacheNamespace(kNamespaces[in_.Below(2)]);
    p.setPool(static_cast<int32_t>(in_.Below(3)) - 1);
    p.setDecodePool(static_cast<int32_t>(in_.Below(3)) - 1);
    p.setChunkTokens(static_cast<int32_t>(in_.Below(4)) * 8 - 1);  // -1, or slices of 7 to 23
    p.setContinued(in_.Below(2) == 0);  // an engine's chunk: more prefills of it follow
    if (in_.Below(3) == 0) {            // client tensors, sometimes with a NaN
      const PoolSpec spec = FuzzPoolSpec();
      TokenActivations a;
      const size_t row = size_t(spec.num_kv_heads) * spec.head_dim;
      const uint8_t fill = in_.Byte();
      for (int l = 0; l < spec.num_layers; ++l) {
        a.k.emplace_back(tokens * row, Bf16{static_cast<uint16_t>(0x3F00 | (fill & 0x7F))});
        a.v.emplace_back(tokens * row, Bf16{static_cast<uint16_t>(0x3E00 | (fill >> 1))});
        a.index_k.emplace_back(tokens * 128, Bf16{0x3F80});
      }
      if (fill == 0xFF) a.v[0][0] = Bf16{0x7FC0};
      ActivationsToWire(a, spec, static_cast<uint32_t>(tokens), p.initActivations());
    }
    return m;
  }

  EnvelopeBuilder Decode(uint64_t id) {
    EnvelopeBuilder m(id);
    auto d = m.envelope().getBody().initDecode();
    const uint32_t n = 1 + in_.Below(3);
    auto steps = d.initSteps(n);
    for (uint32_t i = 0; i < n; ++i) {
      steps[i].setSequence(in_.Below(6));
      steps[i].setToken(static_cast<int32_t>(in_.Below(100)));
    }
    d.setOutputLayers(static_cast<wire::OutputLayers>(in_.Below(3)));
    return m;
  }

  EnvelopeBuilder Append(uint64_t id, uint64_t seq) {
    EnvelopeBuilder m(id);
    auto a = m.envelope().getBody().initAppend();
    a.setSequence(seq);
    a.setCacheNamespace(kNamespaces[in_.Below(2)]);
    const uint32_t n = 1 + in_.Below(40);
    auto t = a.initTokens(n);
    for (uint32_t i = 0; i < n; ++i) t.set(i, static_cast<int32_t>(i));
    return m;
  }

  // Node b asks to move one of its sequences here: a request that fits its lengths or not, its
  // blocks in b's pool (any ids: they are b's), to a pool that exists or not, of this node's
  // layout or another; a quarter of them come from a client, which may not ask.
  void PeerImport(uint64_t id) {
    EnvelopeBuilder m(id);
    auto r = m.envelope().getBody().initPeerImport();
    const PoolSpec spec = FuzzPoolSpec();
    const uint32_t length = in_.Below(4) == 0 ? 0 : 1 + in_.Below(80);
    const uint32_t size = static_cast<uint32_t>(spec.block_size);
    const uint32_t blocks = (length + size - 1) / size + (in_.Below(8) == 0 ? 1 : 0);
    const uint32_t tail = length % size + (in_.Below(8) == 0 ? 1 : 0);
    r.setSequence(in_.Below(6));
    r.setLength(length);
    auto t = r.initTail(tail);
    for (uint32_t i = 0; i < tail; ++i) t.set(i, static_cast<int32_t>(i));
    auto b = r.initBlocks(blocks);
    for (uint32_t i = 0; i < blocks; ++i) b.set(i, static_cast<int32_t>(in_.Below(kFuzzBlocks)));
    r.setToPool(in_.Below(3));
    r.setTransport(in_.Below(4) == 0 ? wire::Transport::NCCL : wire::Transport::SOCKET);
    PoolSpec theirs = spec;
    if (in_.Below(8) == 0) theirs.block_size = 32;
    PoolSpecToWire(theirs, r.initSpec());
    r.setSourceChunkBytes(in_.Below(8) == 0 ? 0 : 1 << 20);
    Deliver(in_.Below(4) == 0 ? kClients[0] : kPeer, m);
  }

  // Node b answers one of kvpoold's calls: a move with its send half (blocks of the sequence or
  // not, the wrong side or transport at times), its commit or an error; a forwarded decode or
  // release with a release reply, an error or a message of the wrong kind.
  void AnswerOnLink() {
    if (link_calls_.empty()) return;
    const size_t pick = in_.Below(static_cast<uint32_t>(link_calls_.size()));
    const LinkCall call = link_calls_[pick];
    EnvelopeBuilder m(call.id);
    auto body = m.envelope().getBody();
    const uint32_t kind = in_.Below(4);
    bool ends = true;
    if (call.blocks.has_value() && kind == 0) {
      auto half = body.initMigrateJob();
      half.setJob(in_.Below(1000));
      half.setTransport(in_.Below(4) == 0 ? wire::Transport::NCCL : wire::Transport::SOCKET);
      const std::vector<int32_t>& ours = *call.blocks;
      auto moves = half.initMoves(static_cast<uint32_t>(ours.size()));
      for (size_t i = 0; i < ours.size(); ++i) {
        moves[i].setSource(in_.Below(8) == 0 ? static_cast<int32_t>(in_.Below(kFuzzBlocks))
                                             : ours[i]);
        moves[i].setTarget(static_cast<int32_t>(in_.Below(kFuzzBlocks)));
      }
      auto link = half.initLink();
      link.setSide(in_.Below(8) == 0 ? wire::TransferSide::RECEIVE : wire::TransferSide::SEND);
      link.setId(in_.Below(4));
      link.setFresh(true);
      const std::string rendezvous = "127.0.0.1:9";
      link.setRendezvous(
          kj::arrayPtr(reinterpret_cast<const kj::byte*>(rendezvous.data()), rendezvous.size()));
      link.setDeadlineMillis(in_.Below(5000));
      link.setSourceChunkBytes(1 << 20);
      link.setTargetChunkBytes(1 << 20);
      ends = false;  // its commit or error is still to come
    } else if (call.blocks.has_value() && kind == 1) {
      auto reply = body.initPeerImportReply();
      reply.setSequence((uint64_t{1} << 62) + in_.Below(4));
      reply.setLength(in_.Below(100));
      reply.setBytes(in_.Below(1 << 16));
      reply.setPool(in_.Below(3));
    } else if (kind == 2) {
      body.initReleaseReply().setReleasedBlocks(in_.Below(8));
    } else if (kind == 3 && in_.Bit()) {
      body.initHealthReply();
    } else {
      const absl::StatusCode code =
          in_.Bit() ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable;
      StatusToWire(absl::Status(code, "injected at node b"), body.initError());
    }
    if (ends) link_calls_.erase(link_calls_.begin() + static_cast<std::ptrdiff_t>(pick));
    Collect(service_.Send(kLink, m));
  }

  // Node b as a client of what it moved here: its heartbeat (which keeps its lease), a decode or
  // a release of a sequence it was given or of another.
  void PeerAsClient(uint64_t id) {
    uint64_t seq = in_.Below(6);
    if (!imported_.empty() && in_.Below(4) != 0) {
      seq = imported_[in_.Below(static_cast<uint32_t>(imported_.size()))];
    }
    EnvelopeBuilder m(id);
    switch (in_.Below(3)) {
      case 0:
        m.envelope().getBody().initHeartbeat().setLease(0);
        break;
      case 1: {
        auto steps = m.envelope().getBody().initDecode().initSteps(1);
        steps[0].setSequence(seq);
        steps[0].setToken(1);
        break;
      }
      default:
        m.envelope().getBody().initRelease().setSequence(seq);
    }
    Deliver(kPeer, m);
  }

  void Deliver(const std::string& from, const EnvelopeBuilder& m) {
    Collect(service_.Send(from, m));
  }

  // Remembers the jobs and leases the broker's messages hand out.
  void Collect(Outbox out) {
    std::vector<std::string> to;
    for (const Outgoing& o : out) to.push_back(o.to);
    std::vector<std::unique_ptr<ParsedEnvelope>> parsed = Replies(out);
    for (size_t i = 0; i < parsed.size(); ++i) {
      const auto envelope = parsed[i]->envelope();
      const auto body = envelope.getBody();
      if (to[i] == kLink) {  // kvpoold asking node b: a move, or a forwarded decode or release
        if (body.isPeerImport()) {
          link_calls_.push_back(
              {envelope.getRequestId(), ListToVector<int32_t>(body.getPeerImport().getBlocks())});
        } else if (!body.isHeartbeat()) {
          link_calls_.push_back({envelope.getRequestId(), std::nullopt});
        }
      } else if (to[i] == kPeer) {  // kvpoold answering node b: remember what it imported
        if (body.isPeerImportReply()) imported_.push_back(body.getPeerImportReply().getSequence());
      } else if (body.isPrefillJob()) {
        jobs_.push_back({to[i], body.getPrefillJob().getJob(), 0});
      } else if (body.isDecodeJob()) {
        jobs_.push_back(
            {to[i], body.getDecodeJob().getJob(), body.getDecodeJob().getSteps().size()});
      } else if (body.isMigrateJob()) {
        jobs_.push_back({to[i], body.getMigrateJob().getJob(), 0});
      } else if (body.isRegisterReply()) {
        leases_[to[i]] = body.getRegisterReply().getLease();
      }
    }
  }

  void Report(bool failed) {
    if (jobs_.empty()) return;
    const size_t pick = in_.Below(static_cast<uint32_t>(jobs_.size()));
    const PendingJob job = jobs_[pick];
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(pick));
    EnvelopeBuilder m(job.job);
    if (failed) {
      auto f = m.envelope().getBody().initJobFailed();
      f.setJob(job.job);
      StatusToWire(absl::InternalError("injected"), f.initError());
    } else {
      auto done = m.envelope().getBody().initJobDone();
      done.setJob(job.job);
      auto outputs = done.initOutputs(job.steps);
      for (uint32_t i = 0; i < job.steps; ++i) outputs[i].setSequence(i);
    }
    Deliver(job.worker, m);
  }

  // A call kvpoold made to node b that b has not ended: a move (with the blocks it named) or a
  // forwarded decode or release.
  struct LinkCall {
    uint64_t id = 0;
    std::optional<std::vector<int32_t>> blocks;
  };

  FuzzInput& in_;
  FuzzService service_;
  const bool peers_;
  std::vector<LinkCall> link_calls_;
  std::vector<uint64_t> imported_;  // sequences kvpoold committed for node b
  std::deque<PendingJob> jobs_;
  std::map<std::string, LeaseId> leases_;
  uint64_t next_id_ = 10;
};

// One fuzz input through a fresh driver: up to 200 steps, then every lease run out. Odd lengths
// move by paired socket moves, so both kinds of move are reached without a byte; moves to another
// node (with peers) are paired socket moves always.
inline int RunBrokerDriver(const uint8_t* data, size_t size, bool peers) {
  FuzzInput in(data, size);
  Driver driver(in, size % 2 == 1 ? std::optional(wire::Transport::SOCKET) : std::nullopt, peers);
  for (int step = 0; step < 200 && !in.done(); ++step) driver.Step();
  driver.Finish();
  return 0;
}

}  // namespace kvp::fuzz
