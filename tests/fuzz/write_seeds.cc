// Writes the fuzz targets' seed corpora: one well-formed input of every kind each target reads,
// so that the fuzzers start past the framing and the schema check. Usage:
//   fuzz_write_seeds DIR   (DIR/<target>/<name>; scripts/fuzz.sh --seeds runs it)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "kvpool/arena/arena_description.h"
#include "kvpool/layout/block_layout.h"
#include "protocol/activations_codec.h"
#include "protocol/block_tables.h"
#include "protocol/status_codec.h"
#include "tests/fuzz/fuzz_service.h"
#include "tests/integration/malformed_messages.h"

namespace kvp::fuzz {
namespace {

std::string Bytes(const EnvelopeBuilder& m) {
  std::string out;
  for (const zmq::message_t& f : m.Frame())
    out.append(static_cast<const char*>(f.data()), f.size());
  return out;
}

// `body` after the head byte that the targets read first.
std::string WithHead(int head, const std::string& body) {
  std::string out;
  out.push_back(static_cast<char>(head));
  out.append(body);
  return out;
}

class Seeds {
 public:
  explicit Seeds(std::filesystem::path dir) : dir_(std::move(dir)) {}
  void Write(const std::string& target, const std::string& name, const std::string& bytes) {
    std::filesystem::create_directories(dir_ / target);
    std::ofstream(dir_ / target / name, std::ios::binary) << bytes;
  }
  // An envelope seed: the head byte picks the peer (0 client, 1 remote, 2 prefill worker, 3 decode
  // worker) and one segment.
  void Envelope(const std::string& name, int peer, const EnvelopeBuilder& m) {
    Write("envelope_fuzz", name, WithHead(peer, Bytes(m)));
  }

 private:
  std::filesystem::path dir_;
};

void EnvelopeSeeds(Seeds& seeds) {
  seeds.Envelope("prefill", 0, SyntheticPrefill(2, 2, 40, 100));
  {
    EnvelopeBuilder m = SyntheticPrefill(3, 3, 4, 7);
    const PoolSpec spec = FuzzPoolSpec();
    TokenActivations a;
    for (int l = 0; l < spec.num_layers; ++l) {
      a.k.emplace_back(4 * spec.num_kv_heads * spec.head_dim, Bf16{0x3F80});
      a.v.emplace_back(4 * spec.num_kv_heads * spec.head_dim, Bf16{0x3E80});
      a.index_k.emplace_back(4 * 128, Bf16{0x3F00});
    }
    auto p = m.envelope().getBody().getPrefill();
    ActivationsToWire(a, spec, 4, p.initActivations());
    p.setCacheNamespace("tenant");
    seeds.Envelope("prefill_tensors", 0, m);
  }
  {
    EnvelopeBuilder m(4);
    auto steps = m.envelope().getBody().initDecode().initSteps(1);
    steps[0].setSequence(1);
    steps[0].setToken(5);
    seeds.Envelope("decode", 0, m);
  }
  {
    EnvelopeBuilder m(5);
    auto a = m.envelope().getBody().initAppend();
    a.setSequence(7);
    a.initTokens(20).set(0, 1);
    seeds.Envelope("append", 0, m);
  }
  for (int kind = 0; kind < 6; ++kind) {
    EnvelopeBuilder m(6);
    auto body = m.envelope().getBody();
    switch (kind) {
      case 0:
        body.initCommit().setSequence(1);
        break;
      case 1:
        body.initAbort().setSequence(1);
        break;
      case 2:
        body.initRelease().setSequence(1);
        break;
      case 3:
        body.initFork().setSource(1);
        break;
      case 4:
        body.initStats();
        break;
      case 5:
        body.initHealth();
        break;
    }
    seeds.Envelope("request_" + std::to_string(kind), kind % 2, m);
  }
  {
    EnvelopeBuilder m(7);
    auto h = m.envelope().getBody().initHeartbeat();
    h.setLease(1);
    h.setEpoch(77);
    seeds.Envelope("heartbeat", 2, m);
  }
  {
    EnvelopeBuilder m(8);
    m.envelope().getBody().initJobDone().setJob(1);
    seeds.Envelope("job_done", 2, m);
    EnvelopeBuilder f(9);
    auto failed = f.envelope().getBody().initJobFailed();
    failed.setJob(1);
    StatusToWire(absl::AbortedError("seed"), failed.initError());
    seeds.Envelope("job_failed", 2, f);
  }
  for (const testing::MalformedMessage& bad : testing::MalformedMessages()) {
    std::string bytes = WithHead(0, "");
    for (const std::string& f : bad.frames) bytes += f;
    std::string name = bad.what;
    for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    seeds.Write("envelope_fuzz", "malformed_" + name, bytes);
  }
}

void JobSeeds(Seeds& seeds) {
  {
    EnvelopeBuilder m(1);
    auto job = m.envelope().getBody().initPrefillJob();
    job.setJob(1);
    job.setSequence(1);
    auto tokens = job.initTokens(20);
    auto slots = job.initSlotMapping(20);
    for (int i = 0; i < 20; ++i) {
      tokens.set(i, i);
      slots.set(i, 32 + i);
    }
    seeds.Write("job_fuzz", "prefill", WithHead(0, Bytes(m)));
  }
  {
    EnvelopeBuilder m(2);
    auto job = m.envelope().getBody().initDecodeJob();
    job.setJob(2);
    auto step = job.initSteps(1)[0];
    const std::vector<int32_t> table = {2, 3};
    step.setSequence(1);
    step.setToken(9);
    step.setPosition(20);
    step.setSlot(3 * 16 + 4);
    auto t = step.initBlockTable(2);
    t.set(0, 2);
    t.set(1, 3);
    HeldBlockTable held;
    held.Replace(0, table);
    step.setBlockTableHash(held.hash());
    seeds.Write("job_fuzz", "decode", WithHead(0, Bytes(m)));
  }
}

void OtherSeeds(Seeds& seeds) {
  ArenaDescription d;
  d.spec = FuzzPoolSpec();
  d.chunk_bytes = {1 << 20};
  d.num_blocks = 4;
  d.spec.v_scales = {0.5f, 0.25f};
  seeds.Write("arena_description_fuzz", "host", EncodeArenaDescription(d));
  seeds.Write("text_files_fuzz", "flags",
              WithHead(0, "# kvpoold\n--layers=4\n--k_scales=0.5,1\n\n--indexer\n"));
  seeds.Write("text_files_fuzz", "keys",
              WithHead(1, "# clients\nrq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\n"));
  std::mt19937_64 rng(2026);
  for (int i = 0; i < 4; ++i) {
    std::string bytes(300 + 200 * i, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    seeds.Write("broker_state_fuzz", "random_" + std::to_string(i), bytes);
  }
  for (int i = 0; i < 4; ++i) {
    std::string bytes(400 + 300 * i, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    seeds.Write("broker_peer_fuzz", "random_" + std::to_string(i), bytes);
  }
}

}  // namespace
}  // namespace kvp::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_write_seeds DIR\n");
    return 2;
  }
  kvp::fuzz::Seeds seeds(argv[1]);
  kvp::fuzz::EnvelopeSeeds(seeds);
  kvp::fuzz::JobSeeds(seeds);
  kvp::fuzz::OtherSeeds(seeds);
  return 0;
}
