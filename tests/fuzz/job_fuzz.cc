// Fuzz target: any bytes, as a message kvpoold sends a worker, through the worker's job decoding
// and the host executor over a real (heap) arena, as kvpool-worker runs them, on a KV pool or (bit
// 2 of the first byte) an MLA pool. Findings: a crash, an exception, a leak, or a read or write
// outside the arena (AddressSanitizer).
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
  // Per pool kind: its context, layout and arena, made once.
  struct Pool {
    explicit Pool(JobContext c)
        : ctx(std::move(c)),
          layout(BlockLayout::Create(ctx.spec).value()),
          arena(static_cast<size_t>(kFuzzBlocks) * layout.block_stride()) {}
    JobContext ctx;
    BlockLayout layout;
    std::vector<uint8_t> arena;
  };
  static Pool kv(JobContext{FuzzPoolSpec(), kFuzzBlocks, FuzzModel()});
  static Pool mla([] {
    ModelConfig model = FuzzModel();
    model.num_q_heads = 16;
    return JobContext{MlaPoolSpec(2, 16, true), kFuzzBlocks, model};
  }());
  FuzzInput in(data, size);
  const uint8_t head = in.Byte();
  Pool& pool = (head & 4) ? mla : kv;
  const JobContext& ctx = pool.ctx;
  WireLimits limits;
  limits.max_layers = static_cast<uint64_t>(ctx.spec.num_layers);
  limits.max_blocks = kFuzzBlocks;
  absl::StatusOr<std::unique_ptr<ParsedEnvelope>> message =
      ParseEnvelope(FramesOf(in.Rest(), 1 + (head & 3)), limits);
  if (!message.ok()) return 0;
  HostExecutor executor(pool.layout, pool.arena.data(), ctx);
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
