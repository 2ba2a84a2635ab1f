#include "client/workload.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "client/percentile.h"
#include "kernels/synthetic/synthetic.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kernels/synthetic/synthetic_model.h"
#include "kvpool/format/bf16.h"
#include "kvpool/format/indexer_quant.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/layout/block_layout.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kVocabulary = 32000;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The bf16 K and V of one verified sequence for one layer, grown as tokens are appended. An MLA
// pool's k is [tokens, 576], latent then RoPE, and its values are the latent: v stays empty.
struct ReferenceCache {
  std::vector<Bf16> k, v;  // [tokens, kv_heads, head_dim]
  int64_t tokens = 0;
};

class Verifier {
 public:
  Verifier(const PoolSpec& spec, const ModelConfig& model)
      : spec_(spec), model_(model), cfg_(SyntheticConfigOf(model)),
        shape_(SyntheticShapeOf(spec, model)) {}

  // Brings the reference cache of (sequence, layer) up to `tokens`.
  void Extend(ReferenceCache& c, int layer, const std::vector<int32_t>& tokens) {
    const size_t row = static_cast<size_t>(spec_.num_kv_heads) * spec_.InputDim();
    const int64_t n = static_cast<int64_t>(tokens.size()) - c.tokens;
    if (n <= 0) return;
    c.k.resize(tokens.size() * row);
    if (!spec_.mla()) c.v.resize(tokens.size() * row);
    FillSyntheticTokens(cfg_, shape_, layer, std::span<const int32_t>(tokens).subspan(c.tokens),
                        static_cast<int32_t>(c.tokens), &c.k[c.tokens * row],
                        spec_.mla() ? nullptr : &c.v[c.tokens * row], nullptr);
    c.tokens = static_cast<int64_t>(tokens.size());
  }

  // Compares one step's output of `layer` with bf16 attention over `positions`. Keys and queries
  // have InputDim values a head, values and outputs head_dim (an MLA pool's values are the first
  // 512 of its keys: the latent).
  void Check(const ReferenceCache& c, int layer, int32_t token, int64_t position,
             const SyntheticNeedle* needle, const std::vector<int64_t>& positions,
             const std::vector<float>& out, WorkloadReport& report) {
    const int kd = spec_.InputDim(), d = spec_.head_dim, qh = model_.num_q_heads;
    const int group = qh / spec_.num_kv_heads;
    std::vector<Bf16> q(static_cast<size_t>(qh) * kd);
    FillSyntheticQuery(cfg_, shape_, layer, SyntheticStepSeed(cfg_, token, position), needle,
                       q.data());
    const double scale = SoftmaxScaleOf(model_, spec_);
    std::vector<double> scores(positions.size()), o(d);
    for (int h = 0; h < qh; ++h) {
      const int kv = h / group;
      double max_score = -INFINITY;
      for (size_t i = 0; i < positions.size(); ++i) {
        const Bf16* k = &c.k[(positions[i] * spec_.num_kv_heads + kv) * kd];
        double dot = 0;
        for (int e = 0; e < kd; ++e) dot += Bf16ToFloat(q[h * kd + e]) * Bf16ToFloat(k[e]);
        scores[i] = dot * scale;
        max_score = std::max(max_score, scores[i]);
      }
      double denominator = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (size_t i = 0; i < positions.size(); ++i) {
        const double w = std::exp(scores[i] - max_score);
        denominator += w;
        const Bf16* v = spec_.mla() ? &c.k[positions[i] * kd]
                                    : &c.v[(positions[i] * spec_.num_kv_heads + kv) * d];
        for (int e = 0; e < d; ++e) o[e] += w * Bf16ToFloat(v[e]);
      }
      for (int e = 0; e < d; ++e) {
        const double ref = o[e] / denominator;
        const double diff = out[h * d + e] - ref;
        err2_ += diff * diff;
        ref2_ += ref * ref;
        report.attention_max_abs = std::max(report.attention_max_abs, std::abs(diff));
      }
      ++report.verified_outputs;
    }
    report.attention_rel_l2 = ref2_ > 0 ? std::sqrt(err2_ / ref2_) : 0;
  }

 private:
  PoolSpec spec_;
  ModelConfig model_;
  SyntheticConfig cfg_;
  SyntheticShape shape_;
  double err2_ = 0, ref2_ = 0;
};

}  // namespace

std::vector<int32_t> WorkloadPrompt(const WorkloadConfig& config, int sequence_index) {
  std::vector<int32_t> tokens(config.prompt_tokens);
  for (int p = 0; p < config.prompt_tokens; ++p) {
    const uint64_t stream = p < config.shared_prefix_tokens ? 0 : sequence_index + 1;
    tokens[p] = static_cast<int32_t>(SyntheticMix(config.seed ^ (stream << 40) ^ p) % kVocabulary);
  }
  return tokens;
}

int32_t WorkloadDecodeToken(const WorkloadConfig& config, int sequence_index, int step) {
  return static_cast<int32_t>(
      SyntheticMix(~config.seed ^ (uint64_t(sequence_index + 1) << 40) ^ step) % kVocabulary);
}

int64_t WorkloadNeedlePosition(const WorkloadConfig& config, int sequence_index, int step,
                               int64_t length) {
  const uint64_t h = SyntheticMix(config.seed * 31 + (uint64_t(sequence_index) << 32) + step);
  return static_cast<int64_t>(h % static_cast<uint64_t>(length));
}

absl::StatusOr<WorkloadReport> RunWorkload(Client& client, const WorkloadConfig& config,
                                           const ProgressFn& progress,
                                           std::vector<DecodeResult>* outputs) {
  if (config.sequences <= 0 || config.prompt_tokens <= 0 || config.decode_steps < 0) {
    return absl::InvalidArgumentError("the workload needs sequences and prompt tokens");
  }
  ASSIGN_OR_RETURN(PoolHealth health, client.Health());
  WorkloadReport report;
  report.config = config;
  report.spec = health.spec;
  report.model = health.model;
  const PoolSpec& spec = health.spec;
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
  report.cache_bytes_per_token = static_cast<double>(layout.block_stride()) / spec.block_size;
  // What a bf16 cache of the same content takes: K and V, or an MLA pool's latent and RoPE part.
  const double bf16_kv = spec.mla() ? 2.0 * kMlaInputDim : 2.0 * spec.num_kv_heads * spec.head_dim * 2;
  report.bf16_bytes_per_token =
      spec.num_layers * (bf16_kv + (spec.indexer ? 2.0 * kIndexHeadDim : 0.0));

  const int n = config.sequences;
  std::vector<std::vector<int32_t>> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = WorkloadPrompt(config, i);
  auto seq_id = [&](int i) { return config.first_sequence + static_cast<uint64_t>(i); };

  // Prefill: every sequence in flight at once; kvpoold queues them for the prefill workers.
  const auto prefill_start = Clock::now();
  for (int i = 0; i < n; ++i) {
    EnvelopeBuilder request = client.NewRequest();
    Client::BuildPrefill(request, seq_id(i), tokens[i], nullptr, nullptr);
    RETURN_IF_ERROR(client.Send(request));
  }
  for (int done = 0; done < n;) {
    ASSIGN_OR_RETURN(auto reply, client.Receive(client.options().timeout_ms));
    ASSIGN_OR_RETURN(PrefillResult r, PrefillResultOf(*reply));
    report.prefix_hit_tokens += r.prefix_hit_tokens;
    progress("prefill", ++done, n);
  }
  report.prefill_seconds = Seconds(Clock::now() - prefill_start);
  report.prefill_tokens = int64_t{n} * config.prompt_tokens;

  // Decode: one batched request per step.
  const int verified = std::min(config.verify_sequences, n);
  Verifier verifier(spec, health.model);
  std::vector<std::vector<ReferenceCache>> refs(verified,
                                                std::vector<ReferenceCache>(spec.num_layers));
  std::vector<double> step_ms;
  double worker_ms = 0;
  const auto decode_start = Clock::now();
  for (int step = 0; step < config.decode_steps; ++step) {
    std::vector<DecodeStepRequest> steps(n);
    for (int i = 0; i < n; ++i) {
      const int64_t length = static_cast<int64_t>(tokens[i].size());
      const int64_t needle = WorkloadNeedlePosition(config, i, step, length);
      steps[i] = DecodeStepRequest{seq_id(i), WorkloadDecodeToken(config, i, step),
                                   NeedleSpec{needle, tokens[i][needle], config.needle_gain},
                                   nullptr, nullptr};
    }
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(DecodeResult result, client.Decode(steps, config.outputs));
    step_ms.push_back(Seconds(Clock::now() - t0) * 1e3);
    worker_ms += result.worker_micros * 1e-3;
    if (result.steps.size() != steps.size()) {
      return absl::InternalError("a decode reply with the wrong number of outputs");
    }
    for (int i = 0; i < n; ++i) {
      tokens[i].push_back(steps[i].token);
      const DecodeStepResult& r = result.steps[i];
      const int64_t position = static_cast<int64_t>(tokens[i].size()) - 1;
      const SyntheticNeedle needle{static_cast<int32_t>(steps[i].needle->position),
                                   steps[i].needle->token, steps[i].needle->gain};
      for (size_t j = 0; j < r.out.size(); ++j) {
        const int layer = config.outputs == wire::OutputLayers::LAST ? spec.num_layers - 1
                                                                     : static_cast<int>(j);
        std::vector<int64_t> selected;
        if (spec.indexer) {
          for (int32_t p : r.topk[j]) {
            if (p >= 0) selected.push_back(p);
          }
          ++report.needles;
          report.needles_found += std::count(r.topk[j].begin(), r.topk[j].end(),
                                             static_cast<int32_t>(needle.position));
        } else {
          for (int64_t p = 0; p <= position; ++p) selected.push_back(p);
        }
        if (i < verified) {
          verifier.Extend(refs[i][layer], layer, tokens[i]);
          verifier.Check(refs[i][layer], layer, steps[i].token, position, &needle, selected,
                         r.out[j], report);
        }
      }
    }
    if (outputs != nullptr) outputs->push_back(std::move(result));
    progress("decode", step + 1, config.decode_steps);
  }
  report.decode_seconds = Seconds(Clock::now() - decode_start);
  report.decode_tokens = int64_t{n} * config.decode_steps;
  report.step_p50_ms = Percentile(step_ms, 0.5);
  report.step_p99_ms = Percentile(step_ms, 0.99);
  report.worker_ms_mean = step_ms.empty() ? 0 : worker_ms / step_ms.size();
  if (config.release) {
    for (int i = 0; i < n; ++i) RETURN_IF_ERROR(client.Release(seq_id(i)).status());
  }
  return report;
}

std::string WorkloadTable(const WorkloadReport& r) {
  const WorkloadConfig& c = r.config;
  std::string out = absl::StrFormat(
      "workload: %d sequences x %d prompt tokens (%d shared), %d decode steps; pool: %s, "
      "q_heads=%d topk=%d\n",
      c.sequences, c.prompt_tokens, c.shared_prefix_tokens, c.decode_steps, r.spec.DebugString(),
      r.model.num_q_heads, r.model.topk);
  auto line = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, absl::StrFormat("  %-34s %s\n", k, v));
  };
  line("prefill", absl::StrFormat("%d tokens in %.3f s: %.0f tokens/s (%d prefix-hit tokens)",
                                  r.prefill_tokens, r.prefill_seconds,
                                  r.prefill_tokens / std::max(r.prefill_seconds, 1e-9),
                                  r.prefix_hit_tokens));
  line("decode", absl::StrFormat("%d tokens in %.3f s: %.0f tokens/s", r.decode_tokens,
                                 r.decode_seconds,
                                 r.decode_tokens / std::max(r.decode_seconds, 1e-9)));
  line("decode step (batch of all sequences)",
       absl::StrFormat("p50 %.2f ms, p99 %.2f ms; worker %.2f ms", r.step_p50_ms, r.step_p99_ms,
                       r.worker_ms_mean));
  line("cache bytes per token (all layers)",
       absl::StrFormat("%.0f vs %.0f bf16: %.2fx smaller", r.cache_bytes_per_token,
                       r.bf16_bytes_per_token, r.bf16_bytes_per_token / r.cache_bytes_per_token));
  line("attention error vs bf16 K/V",
       r.verified_outputs == 0
           ? std::string("not checked")
           : absl::StrFormat("rel. L2 %.4f, max abs %.4f over %d head outputs",
                             r.attention_rel_l2, r.attention_max_abs, r.verified_outputs));
  line("needle recall (top-k)",
       r.needles == 0 ? std::string("no indexer")
                      : absl::StrFormat("%.4f (%d of %d)", double(r.needles_found) / r.needles,
                                        r.needles_found, r.needles));
  return out;
}

std::string WorkloadJson(const WorkloadReport& r, const std::string& date, const std::string& host,
                         const std::string& device) {
  const WorkloadConfig& c = r.config;
  return absl::StrFormat(
      "{\n  \"bench\": \"service-workload\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"device\": \"%s\",\n  \"pool\": \"%s\",\n  \"q_heads\": %d,\n  \"topk\": %d,\n"
      "  \"sequences\": %d,\n  \"prompt_tokens\": %d,\n  \"shared_prefix_tokens\": %d,\n"
      "  \"decode_steps\": %d,\n  \"prefill_tokens_per_s\": %.1f,\n"
      "  \"prefix_hit_tokens\": %d,\n  \"decode_tokens_per_s\": %.1f,\n"
      "  \"step_p50_ms\": %.4f,\n  \"step_p99_ms\": %.4f,\n  \"worker_step_ms\": %.4f,\n"
      "  \"cache_bytes_per_token\": %.1f,\n  \"bf16_bytes_per_token\": %.1f,\n"
      "  \"attention_rel_l2\": %.6f,\n  \"attention_max_abs\": %.6f,\n"
      "  \"verified_outputs\": %d,\n  \"needles\": %d,\n  \"needles_found\": %d\n}\n",
      date, host, device, r.spec.DebugString(), r.model.num_q_heads, r.model.topk, c.sequences,
      c.prompt_tokens, c.shared_prefix_tokens, c.decode_steps,
      r.prefill_tokens / std::max(r.prefill_seconds, 1e-9), r.prefix_hit_tokens,
      r.decode_tokens / std::max(r.decode_seconds, 1e-9), r.step_p50_ms, r.step_p99_ms,
      r.worker_ms_mean, r.cache_bytes_per_token, r.bf16_bytes_per_token, r.attention_rel_l2,
      r.attention_max_abs, r.verified_outputs, r.needles, r.needles_found);
}

}  // namespace kvp
