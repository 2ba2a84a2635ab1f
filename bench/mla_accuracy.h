// The accuracy of an MLA pool: sparse MLA decode over the fp8_ds_mla cache against the same
// attention over the bf16 latents (what a pool without quantization would hold), on the synthetic
// model's latents (outlier channels included) and queries that lean on one earlier token.
#pragma once

#include "absl/status/statusor.h"
#include "bench/accuracy.h"

namespace kvp::bench {


// `config`'s sequences and context (its head counts and head_dim are the K/V pools').
absl::StatusOr<MlaAccuracy> RunMlaAccuracy(const AccuracyConfig& config);

}  // namespace kvp::bench
