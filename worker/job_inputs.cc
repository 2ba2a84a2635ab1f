#include "worker/job_inputs.h"

#include <algorithm>

#include "kernels/synthetic/synthetic_model.h"
#include "kvpool/format/indexer_quant.h"

namespace kvp {
namespace {

// Appends rows of `from` (a layer's tensor) to `to`.
template <typename T>
void Append(const std::vector<T>& from, std::vector<T>* to) {
  to->insert(to->end(), from.begin(), from.end());
}

}  // namespace

size_t TokenRow(const PoolSpec& spec) {
  return static_cast<size_t>(spec.num_kv_heads) * spec.InputDim();
}

DecodeBatch DecodeBatchOf(const DecodeWork& work) {
  DecodeBatch b;
  for (const DecodeStepWork& s : work.steps) {
    b.stride = std::max(b.stride, static_cast<int32_t>(s.block_table.size()));
    b.max_len = std::max(b.max_len, static_cast<int32_t>(s.position + 1));
  }
  const size_t n = work.steps.size();
  b.tables.assign(n * b.stride, 0);
  b.lens.resize(n);
  b.slots.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const DecodeStepWork& s = work.steps[i];
    std::copy(s.block_table.begin(), s.block_table.end(), b.tables.begin() + i * b.stride);
    b.lens[i] = static_cast<int32_t>(s.position + 1);
    b.slots[i] = s.slot;
  }
  return b;
}

std::vector<DecodeStepResult> EmptyResults(const DecodeWork& work) {
  std::vector<DecodeStepResult> results(work.steps.size());
  for (size_t i = 0; i < results.size(); ++i) {
    results[i].sequence = work.steps[i].sequence;
    results[i].length = work.steps[i].position + 1;
  }
  return results;
}

void FillPrefillInputs(const PrefillWork& work, const JobContext& ctx, int layer,
                       TokenInputs* out) {
  const size_t n = work.tokens.size();
  const size_t row = TokenRow(ctx.spec);
  const bool values = !ctx.spec.mla();
  if (work.activations.has_value()) {
    out->k = work.activations->k[layer];
    out->v = values ? work.activations->v[layer] : std::vector<Bf16>();
    out->index_k = ctx.spec.indexer ? work.activations->index_k[layer] : std::vector<Bf16>();
    return;
  }
  out->k.resize(n * row);
  out->v.resize(values ? n * row : 0);
  out->index_k.resize(ctx.spec.indexer ? n * kIndexHeadDim : 0);
  FillSyntheticTokens(SyntheticConfigOf(ctx.model), SyntheticShapeOf(ctx.spec, ctx.model), layer,
                      work.tokens, static_cast<int32_t>(work.first_position), out->k.data(),
                      values ? out->v.data() : nullptr,
                      ctx.spec.indexer ? out->index_k.data() : nullptr);
}

void FillDecodeTokenInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           TokenInputs* out) {
  const size_t row = TokenRow(ctx.spec);
  const bool values = !ctx.spec.mla();
  out->k.clear();
  out->v.clear();
  out->index_k.clear();
  std::vector<Bf16> k(row), v(values ? row : 0), index_k(kIndexHeadDim);
  for (const DecodeStepWork& s : work.steps) {
    if (s.activations.has_value()) {
      Append(s.activations->k[layer], &out->k);
      if (values) Append(s.activations->v[layer], &out->v);
      if (ctx.spec.indexer) Append(s.activations->index_k[layer], &out->index_k);
      continue;
    }
    const int32_t token = s.token;
    FillSyntheticTokens(SyntheticConfigOf(ctx.model), SyntheticShapeOf(ctx.spec, ctx.model), layer,
                        std::span<const int32_t>(&token, 1), static_cast<int32_t>(s.position),
                        k.data(), values ? v.data() : nullptr,
                        ctx.spec.indexer ? index_k.data() : nullptr);
    Append(k, &out->k);
    Append(v, &out->v);
    if (ctx.spec.indexer) Append(index_k, &out->index_k);
  }
}

void FillDecodeQueryInputs(const DecodeWork& work, const JobContext& ctx, int layer,
                           QueryInputs* out) {
  const SyntheticConfig cfg = SyntheticConfigOf(ctx.model);
  const SyntheticShape shape = SyntheticShapeOf(ctx.spec, ctx.model);
  const size_t q_row = static_cast<size_t>(ctx.model.num_q_heads) * ctx.spec.InputDim();
  out->q.clear();
  out->index_q.clear();
  out->weights.clear();
  std::vector<Bf16> q(q_row), index_q(kIndexHeads * kIndexHeadDim);
  std::vector<float> weights(kIndexHeads);
  for (const DecodeStepWork& s : work.steps) {
    if (s.queries.has_value()) {
      Append(s.queries->q[layer], &out->q);
      if (ctx.spec.indexer) {
        Append(s.queries->index_q[layer], &out->index_q);
        Append(s.queries->head_weights[layer], &out->weights);
      }
      continue;
    }
    const uint64_t seed = SyntheticStepSeed(cfg, s.token, s.position);
    const SyntheticNeedle* needle = s.needle.has_value() ? &*s.needle : nullptr;
    FillSyntheticQuery(cfg, shape, layer, seed, needle, q.data());
    Append(q, &out->q);
    if (ctx.spec.indexer) {
      FillSyntheticIndexQuery(cfg, layer, seed, needle, index_q.data(), weights.data());
      Append(index_q, &out->index_q);
      Append(weights, &out->weights);
    }
  }
}

}  // namespace kvp
