#include "bench/mla_accuracy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "base/status_macros.h"
#include "bench/output_errors.h"
#include "kernels/mla/mla_ref.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/format/mla_latent.h"
#include "tests/testing/mla_layer.h"

namespace kvp::bench {

absl::StatusOr<MlaAccuracy> RunMlaAccuracy(const AccuracyConfig& c) {
  MlaAccuracy r;
  r.bytes_per_token = kMlaTokenBytes;
  r.bf16_bytes_per_token = kMlaInputDim * 2;
  std::fprintf(stderr, "accuracy: fp8_ds_mla, %d sequences x %d tokens, %d heads\n", c.num_seqs,
               c.context, r.heads);
  const int block = 64;
  const int blocks_per_seq = (c.context + block - 1) / block;
  const int64_t blocks = int64_t{blocks_per_seq} * c.num_seqs;
  std::vector<uint8_t> arena(blocks * testing::MlaLayerStride(block));
  const LayerCache cache = testing::MlaLayer(arena.data(), blocks, block);
  const SyntheticShape shape{1, r.heads, kMlaInputDim};
  SyntheticConfig synth;
  synth.seed = c.seed;
  std::mt19937_64 rng(c.seed);
  double latent_err = 0, latent_ref = 0;
  OutputErrors errors;
  std::vector<Bf16> tokens_in(size_t(c.context) * kMlaInputDim), q(size_t(r.heads) * kMlaInputDim);
  std::vector<int64_t> slots(c.context);
  std::vector<int32_t> selected(c.context);
  std::vector<Bf16> out(size_t(r.heads) * kMlaLatentDim);
  std::vector<float> lse(r.heads);
  for (int s = 0; s < c.num_seqs; ++s) {
    std::vector<int32_t> tokens(c.context);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 128000);
    FillSyntheticTokens(synth, shape, 0, tokens, 0, tokens_in.data(), nullptr, nullptr);
    const int32_t target = static_cast<int32_t>(rng() % c.context);
    const SyntheticNeedle needle{target, tokens[target], 0.35f};
    FillSyntheticQuery(synth, shape, 0, rng(), &needle, q.data());
    for (int i = 0; i < c.context; ++i) {
      slots[i] = int64_t{s} * blocks_per_seq * block + i;
      selected[i] = static_cast<int32_t>(slots[i]);
    }
    RETURN_IF_ERROR(
        MlaCacheWriteRef(MlaRowsWrite(cache, tokens_in.data(), nullptr, slots.data(), c.context)));
    RETURN_IF_ERROR(SparseMlaDecodeRef(SparseMlaDecodeParams{
        .cache = cache, .q = q.data(), .slots = selected.data(), .batch = 1, .s_q = 1,
        .heads = r.heads, .topk = c.context, .softmax_scale = kDeepSeekV32SoftmaxScale,
        .out = out.data(), .lse = lse.data()}));
    for (int i = 0; i < c.context; ++i) {
      float decoded[kMlaInputDim];
      DecodeMlaToken(cache.LatentOfSlot(slots[i]), decoded);
      for (int e = 0; e < kMlaLatentDim; ++e) {
        const double x = Bf16ToFloat(tokens_in[size_t(i) * kMlaInputDim + e]);
        latent_err += (decoded[e] - x) * (decoded[e] - x);
        latent_ref += x * x;
      }
    }
    // The same attention over the bf16 latents, in double.
    std::vector<double> scores(c.context), want(kMlaLatentDim);
    for (int h = 0; h < r.heads; ++h) {
      double top = -INFINITY;
      for (int i = 0; i < c.context; ++i) {
        double dot = 0;
        for (int e = 0; e < kMlaInputDim; ++e) {
          dot += double(Bf16ToFloat(q[size_t(h) * kMlaInputDim + e])) *
                 Bf16ToFloat(tokens_in[size_t(i) * kMlaInputDim + e]);
        }
        scores[i] = kDeepSeekV32SoftmaxScale * dot;
        top = std::max(top, scores[i]);
      }
      std::fill(want.begin(), want.end(), 0.0);
      double sum = 0;
      for (int i = 0; i < c.context; ++i) {
        const double w = std::exp(scores[i] - top);
        sum += w;
        for (int e = 0; e < kMlaLatentDim; ++e) {
          want[e] += w * Bf16ToFloat(tokens_in[size_t(i) * kMlaInputDim + e]);
        }
      }
      std::vector<double> got(kMlaLatentDim);
      for (int e = 0; e < kMlaLatentDim; ++e) {
        want[e] /= sum;
        got[e] = Bf16ToFloat(out[size_t(h) * kMlaLatentDim + e]);
      }
      errors.Add(got, want);
    }
  }
  r.output_rel_l2 = errors.rel_l2();
  r.output_rel_l2_p99 = errors.rel_l2_p99();
  r.min_cosine = errors.min_cosine();
  r.latent_rel_mse = latent_err / latent_ref;
  return r;
}

}  // namespace kvp::bench
