// Fuzz target: any bytes, as one ZeroMQ message from any kind of peer, into kvpoold's broker (the
// envelope decoder and every handler). Findings: a crash, an exception, a leak, a reply that does
// not parse, or a pool invariant broken (a block lost, owned twice, or counted wrong).
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_service.h"

namespace kvp::fuzz {
namespace {

constexpr const char* kPeers[] = {"ipc/client", "tcp/remote", "ipc/prefill", "ipc/decode"};

}  // namespace
}  // namespace kvp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;
  using namespace kvp::fuzz;
  FuzzInput in(data, size);
  const uint8_t head = in.Byte();
  FuzzService service;
  service.Register("ipc/prefill", wire::Role::PREFILL);
  service.Register("ipc/decode", wire::Role::DECODE);
  // A committed sequence 1 of the client's, so that decode, fork and release have one to touch.
  Outbox out = service.Send("ipc/client", SyntheticPrefill(1, 1, 40, 100));
  for (const auto& job : Replies(out, "ipc/prefill")) {
    EnvelopeBuilder done(job->request_id());
    done.envelope().getBody().initJobDone().setJob(
        job->envelope().getBody().getPrefillJob().getJob());
    service.Send("ipc/prefill", done);
  }
  out = service.Send(kPeers[head & 3], FramesOf(in.Rest(), 1 + ((head >> 2) & 3)));
  Replies(out);
  CheckOrDie(service.Check(), "pool invariants after the message");
  out = service.Tick(40'000'000);  // every lease expires: everything must come back
  Replies(out);
  CheckOrDie(service.Check(), "pool invariants after the leases expired");
  if (service.pools().counts().reserved != 0 || service.pools().counts().used != 0) {
    CheckOrDie(absl::InternalError("blocks held after every lease expired"), "leak");
  }
  return 0;
}
