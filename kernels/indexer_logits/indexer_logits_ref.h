// CPU reference of the lightning-indexer logits (double accumulation, rounded once to float).
#pragma once

#include "absl/status/status.h"
#include "kernels/indexer_logits/indexer_logits_params.h"

namespace kvp {

absl::Status IndexerLogitsRef(const IndexerLogitsParams& p);

}  // namespace kvp
