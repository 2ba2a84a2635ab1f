// Fuzz target: any bytes, as a message kvpoold sends a worker, through the worker's job decoding
// and the host executor over a real (heap) arena, as kvpool-worker runs them. Findings: a crash,
// an exception, a leak, or a read or write outside the arena (AddressSanitizer).
#include <vector>

#include "kvpool/layout/block_layout.h"
#include "protocol/framing.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_service.h"
#include "worker/host_executor.h"
#include "worker/job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;
  using namespace kvp::fuzz;
  static const BlockLayout layout = BlockLayout::Create(FuzzPoolSpec()).value();
  static std::vector<uint8_t> arena(static_cast<size_t>(kFuzzBlocks) * layout.block_stride());
  const JobContext ctx{FuzzPoolSpec(), kFuzzBlocks, FuzzModel()};
  FuzzInput in(data, size);
  const uint8_t head = in.Byte();
  WireLimits limits;
  limits.max_layers = static_cast<uint64_t>(ctx.spec.num_layers);
  limits.max_blocks = kFuzzBlocks;
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> message =
      ParseEnvelope(FramesOf(in.Rest(), 1 + (head & 3)), limits);
  if (!message.ok()) return 0;
  HostExecutor executor(layout, arena.data(), ctx);
  const auto body = (*message)->envelope().getBody();
  if (body.isPrefillJob()) {
    absl::StatusOr<PrefillWork> work = PrefillWorkFromWire(body.getPrefillJob(), ctx);
    if (work.ok()) executor.Prefill(*work).IgnoreError();
  } else if (body.isDecodeJob()) {
    BlockTableCache tables;
    absl::StatusOr<DecodeWork> work = DecodeWorkFromWire(body.getDecodeJob(), ctx, tables);
    if (work.ok()) executor.Decode(*work).IgnoreError();
  }
  return 0;
}
