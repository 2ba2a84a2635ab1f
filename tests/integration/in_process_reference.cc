#include "tests/integration/in_process_reference.h"

#include "base/status_macros.h"
#include "kvpool/arena/host_arena.h"
#include "kvpool/pool/pool.h"
#include "worker/host_executor.h"

namespace kvp::testing {

absl::StatusOr<std::vector<std::vector<DecodeStepResult>>> RunWorkloadInProcess(
    const WorkloadConfig& config, const PoolSpec& spec, const ModelConfig& model) {
  constexpr uint64_t kArenaBytes = uint64_t{64} << 20;
  ASSIGN_OR_RETURN(HostArena arena, HostArena::Create(kArenaBytes, kArenaBytes, kArenaBytes));
  ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, Pool::Create(spec, kArenaBytes));
  const LeaseId lease = 1;  // the only holder
  const JobContext ctx{spec, pool->blocks().num_blocks(), model};
  HostExecutor executor(pool->layout(), arena.base(), ctx);
  SequenceTable& sequences = pool->sequences();

  const int n = config.sequences;
  std::vector<std::vector<int32_t>> tokens(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = WorkloadPrompt(config, i);
    const SeqId seq = config.first_sequence + i;
    ASSIGN_OR_RETURN(AppendPlan plan, sequences.Append(seq, lease, tokens[i]));
    PrefillWork work;
    work.sequence = seq;
    work.tokens.assign(tokens[i].begin() + plan.prefix_hit_tokens, tokens[i].end());
    work.first_position = plan.prefix_hit_tokens;
    work.slots = plan.slots;
    work.copies = plan.copies;
    RETURN_IF_ERROR(executor.Prefill(work));
    RETURN_IF_ERROR(sequences.Commit(seq));
  }
  std::vector<std::vector<DecodeStepResult>> outputs;
  for (int step = 0; step < config.decode_steps; ++step) {
    DecodeWork work;
    work.outputs = config.outputs;
    for (int i = 0; i < n; ++i) {
      const SeqId seq = config.first_sequence + i;
      const int64_t length = static_cast<int64_t>(tokens[i].size());
      const int32_t token = WorkloadDecodeToken(config, i, step);
      const int64_t needle = WorkloadNeedlePosition(config, i, step, length);
      ASSIGN_OR_RETURN(AppendPlan plan, sequences.Append(seq, lease, {&token, 1}));
      DecodeStepWork s;
      s.sequence = seq;
      s.token = token;
      s.position = length;
      s.slot = plan.slots.at(0);
      ASSIGN_OR_RETURN(absl::Span<const BlockId> blocks, sequences.Blocks(seq));
      s.block_table.assign(blocks.begin(), blocks.end());
      s.copies = plan.copies;
      s.needle = SyntheticNeedle{static_cast<int32_t>(needle), tokens[i][needle],
                                 config.needle_gain};
      work.steps.push_back(std::move(s));
      tokens[i].push_back(token);
    }
    ASSIGN_OR_RETURN(std::vector<DecodeStepResult> results, executor.Decode(work));
    for (int i = 0; i < n; ++i) RETURN_IF_ERROR(sequences.Commit(config.first_sequence + i));
    outputs.push_back(std::move(results));
  }
  return outputs;
}

}  // namespace kvp::testing
