#include "tests/worker/served_pools.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp::testing {

std::vector<JobContext> PoolsServedBy(const OpCapabilities& served) {
  std::vector<JobContext> pools;
  for (int k = 0; k < kNumKvFormats; ++k) {
    for (int v = 0; v < kNumKvFormats; ++v) {
      for (int d : kHeadDims) {
        if (!served.Serves(static_cast<KvFormat>(k), static_cast<KvFormat>(v), d)) continue;
        for (bool indexer : {false, true}) {
          JobContext ctx;
          ctx.spec.num_layers = 2;
          ctx.spec.num_kv_heads = 2;
          ctx.spec.head_dim = d;
          ctx.spec.block_size = 16;
          ctx.spec.k_format = static_cast<KvFormat>(k);
          ctx.spec.v_format = static_cast<KvFormat>(v);
          ctx.spec.indexer = indexer;
          ctx.num_blocks = kServedPoolBlocks;
          ctx.model.num_q_heads = 4;
          ctx.model.topk = 16;
          pools.push_back(ctx);
        }
      }
    }
  }
  if (served.mla) {
    JobContext ctx;
    ctx.spec = MlaPoolSpec(/*num_layers=*/2, /*block_size=*/16, /*indexer_ue8m0=*/true);
    ctx.num_blocks = kServedPoolBlocks;
    ctx.model.num_q_heads = 16;
    ctx.model.topk = 16;
    pools.push_back(ctx);
  }
  return pools;
}

absl::Status PrefillAndDecode(Executor& executor, const JobContext& ctx) {
  PrefillWork prefill;
  prefill.sequence = 1;
  for (int i = 0; i < 20; ++i) {
    prefill.tokens.push_back(100 + i);
    prefill.slots.push_back(i);
  }
  RETURN_IF_ERROR(executor.Prefill(prefill));
  DecodeWork decode;
  DecodeStepWork step;
  step.sequence = 1;
  step.token = 7;
  step.position = 20;
  step.slot = 20;
  step.block_table = {0, 1};
  decode.steps.push_back(step);
  ASSIGN_OR_RETURN(const std::vector<DecodeStepResult> results, executor.Decode(decode));
  if (results.size() != 1 || results[0].out.size() != static_cast<size_t>(ctx.spec.num_layers)) {
    return absl::InternalError("the decode returned no outputs for every layer");
  }
  for (const std::vector<float>& layer : results[0].out) {
    for (float x : layer) {
      if (!std::isfinite(x)) return absl::InternalError("an output is not finite");
    }
  }
  return absl::OkStatus();
}

}  // namespace kvp::testing
