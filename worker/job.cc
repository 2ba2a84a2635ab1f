#include "worker/job.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/layout/layer_cache.h"
#include "protocol/lists.h"

namespace kvp {
namespace {

absl::StatusOr<std::vector<BlockCopyPair>> CopiesFromWire(capnp::List<wire::BlockCopy>::Reader list,
                                                          const JobContext& ctx) {
  std::vector<BlockCopyPair> copies;
  for (auto c : list) {
    for (int32_t b : {c.getSource(), c.getTarget()}) {
      if (b < 0 || b >= ctx.num_blocks) {
        return absl::OutOfRangeError(
            absl::StrCat("block copy names block ", b, "; the arena has ", ctx.num_blocks));
      }
    }
    copies.emplace_back(c.getSource(), c.getTarget());
  }
  return copies;
}

absl::Status CheckSlot(int64_t slot, const JobContext& ctx) {
  const int64_t slots = ctx.num_blocks * ctx.spec.block_size;
  if (slot < 0 || slot >= slots) {
    return absl::OutOfRangeError(
        absl::StrCat("slot ", slot, " is outside the arena's ", slots, " slots"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrefillWork> PrefillWorkFromWire(wire::PrefillJob::Reader job,
                                                const JobContext& ctx) {
  PrefillWork w;
  w.sequence = job.getSequence();
  for (int32_t t : job.getTokens()) w.tokens.push_back(t);
  // Positions are int32 in the kernels (and the synthetic model): the whole prefill must be.
  const uint64_t first = job.getFirstPosition();
  if (first > static_cast<uint64_t>(INT32_MAX) ||
      job.getTokens().size() > static_cast<uint64_t>(INT32_MAX) - first) {
    return absl::OutOfRangeError(absl::StrCat("prefill job starting at position ",
                                              job.getFirstPosition(), " runs past 2^31 - 1"));
  }
  w.first_position = static_cast<int64_t>(job.getFirstPosition());
  for (int64_t s : job.getSlotMapping()) {
    RETURN_IF_ERROR(CheckSlot(s, ctx));
    w.slots.push_back(s);
  }
  if (w.slots.size() != w.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("prefill job with ", w.tokens.size(),
                                                   " tokens and ", w.slots.size(), " slots"));
  }
  ASSIGN_OR_RETURN(w.copies, CopiesFromWire(job.getCopies(), ctx));
  if (job.hasActivations()) {
    ASSIGN_OR_RETURN(w.activations, ActivationsFromWire(job.getActivations(), ctx.spec,
                                                        static_cast<uint32_t>(w.tokens.size())));
  }
  return w;
}

absl::StatusOr<DecodeWork> DecodeWorkFromWire(wire::DecodeJob::Reader job, const JobContext& ctx,
                                              BlockTableCache& tables) {
  DecodeWork w;
  w.outputs = job.getOutputLayers();
  for (uint64_t seq : job.getForget()) tables.erase(seq);
  for (auto s : job.getSteps()) {
    DecodeStepWork step;
    step.sequence = s.getSequence();
    step.token = s.getToken();
    step.position = static_cast<int64_t>(s.getPosition());
    step.slot = s.getSlot();
    RETURN_IF_ERROR(CheckSlot(step.slot, ctx));
    HeldBlockTable& held = tables[step.sequence];
    const size_t from = s.getBlockTableFrom();
    if (from > held.size()) {
      return absl::AbortedError(absl::StrCat("sequence ", step.sequence, ": the block table ",
                                             "continues after block ", from, " but this worker ",
                                             "holds ", held.size()));
    }
    // Only the new blocks are checked and hashed: what is held was checked when it came.
    const std::vector<int32_t> tail = ListToVector<int32_t>(s.getBlockTable());
    for (int32_t b : tail) {
      if (b < 0 || b >= ctx.num_blocks) {
        return absl::OutOfRangeError(absl::StrCat("sequence ", step.sequence, ": block ", b,
                                                  " is outside the arena's ", ctx.num_blocks,
                                                  " blocks"));
      }
    }
    held.Replace(from, tail);
    if (held.hash() != s.getBlockTableHash()) {
      return absl::AbortedError(absl::StrCat("sequence ", step.sequence, ": the rebuilt block ",
                                             "table does not match kvpoold's"));
    }
    step.block_table.assign(held.blocks().begin(), held.blocks().end());
    // Compared without arithmetic on the position: a hostile one near 2^64 must not wrap.
    const uint64_t positions = static_cast<uint64_t>(step.block_table.size()) *
                               static_cast<uint64_t>(ctx.spec.block_size);
    if (s.getPosition() >= positions) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", step.sequence, ": position ",
                                                step.position, " is past its ",
                                                step.block_table.size(), " blocks"));
    }
    if (SlotOfPosition(step.block_table.data(), step.position, ctx.spec.block_size) != step.slot) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", step.sequence, ": slot ",
                                                     step.slot, " is not position ", step.position,
                                                     " of its block table"));
    }
    ASSIGN_OR_RETURN(step.copies, CopiesFromWire(s.getCopies(), ctx));
    if (s.hasActivations()) {
      ASSIGN_OR_RETURN(step.activations, ActivationsFromWire(s.getActivations(), ctx.spec, 1));
    }
    if (s.hasQueries()) {
      ASSIGN_OR_RETURN(step.queries, QueriesFromWire(s.getQueries(), ctx.spec, ctx.model));
    }
    if (s.hasNeedle()) {
      const auto n = s.getNeedle();
      if (n.getPosition() >= static_cast<uint64_t>(step.position)) {
        return absl::OutOfRangeError(absl::StrCat("sequence ", step.sequence, ": needle at ",
                                                  n.getPosition(), " is not before position ",
                                                  step.position));
      }
      step.needle =
          SyntheticNeedle{static_cast<int32_t>(n.getPosition()), n.getToken(), n.getGain()};
    }
    w.steps.push_back(std::move(step));
  }
  return w;
}

}  // namespace kvp
