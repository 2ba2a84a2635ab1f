#include "bench/accuracy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/fp8_math_attention.h"
#include "bench/mla_accuracy.h"
#include "bench/output_errors.h"
#include "kernels/cache_write/cache_write_ref.h"
#include "kernels/paged_decode/paged_decode_ref.h"
#include "kernels/synthetic/synthetic_fill.h"
#include "kvpool/format/kv_format_names.h"
#include "kvpool/layout/block_layout.h"

namespace kvp::bench {
namespace {

// The synthetic workload, generated once and written into every pool under test.
struct Workload {
  SyntheticShape shape;
  std::vector<Bf16> k, v;         // [seqs · context, kv_heads, d]
  std::vector<Bf16> q;            // [seqs, q_heads, d]
  std::vector<int32_t> seq_lens;  // all = context
};

Workload MakeWorkload(const AccuracyConfig& c) {
  Workload w;
  w.shape = {c.num_kv_heads, c.num_q_heads, c.head_dim};
  SyntheticConfig synth;
  synth.seed = c.seed;
  const size_t row = size_t{static_cast<size_t>(c.num_kv_heads)} * c.head_dim;
  w.k.resize(size_t{static_cast<size_t>(c.num_seqs)} * c.context * row);
  w.v.resize(w.k.size());
  w.q.resize(size_t{static_cast<size_t>(c.num_seqs)} * c.num_q_heads * c.head_dim);
  w.seq_lens.assign(c.num_seqs, c.context);
  std::mt19937_64 rng(c.seed);
  for (int s = 0; s < c.num_seqs; ++s) {
    std::vector<int32_t> tokens(c.context);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 128000);
    const size_t base = size_t{static_cast<size_t>(s)} * c.context * row;
    FillSyntheticTokens(synth, w.shape, 0, tokens, 0, &w.k[base], &w.v[base], nullptr);
    // Each query leans on one earlier token: peaked but not one-hot attention.
    const int32_t target = static_cast<int32_t>(rng() % c.context);
    const SyntheticNeedle needle{target, tokens[target], 0.35f};
    FillSyntheticQuery(synth, w.shape, 0, rng(), &needle,
                       &w.q[size_t{static_cast<size_t>(s)} * c.num_q_heads * c.head_dim]);
  }
  return w;
}

// One layer's cache holding the workload's K/V in the given formats; sequence s owns blocks
// [s · blocks_per_seq, (s + 1) · blocks_per_seq).
struct FilledPool {
  FilledPool(BlockLayout l, int blocks) : layout(std::move(l)), blocks_per_seq(blocks) {}

  BlockLayout layout;
  int blocks_per_seq;
  std::vector<uint8_t> arena;
  std::vector<int32_t> tables;
  std::vector<int64_t> slots;  // of each token of the workload, in order

  int64_t num_blocks() const { return static_cast<int64_t>(tables.size()); }
  LayerCache Cache() { return layout.Layer(arena.data(), num_blocks(), 0); }

  // Dense decode of every sequence's query over its whole context into `out`.
  AttentionParams Attention(const AccuracyConfig& c, const Workload& w, float* out) {
    AttentionParams a;
    a.cache = Cache();
    a.q = w.q.data();
    a.block_tables = tables.data();
    a.block_table_stride = blocks_per_seq;
    a.seq_lens = w.seq_lens.data();
    a.out = out;
    a.num_seqs = c.num_seqs;
    a.num_q_heads = c.num_q_heads;
    a.softmax_scale = DefaultSoftmaxScale(c.head_dim);
    return a;
  }
};

absl::StatusOr<FilledPool> Fill(const AccuracyConfig& c, const Workload& w, KvFormat k_format,
                                KvFormat v_format) {
  PoolSpec spec;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.k_format = k_format;
  spec.v_format = v_format;
  ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Create(spec));
  FilledPool pool(std::move(layout), static_cast<int>(BlocksForTokens(c.context, spec.block_size)));
  pool.tables.resize(int64_t{c.num_seqs} * pool.blocks_per_seq);
  std::iota(pool.tables.begin(), pool.tables.end(), 0);
  pool.arena.resize(pool.num_blocks() * pool.layout.block_stride());
  pool.slots.resize(size_t{static_cast<size_t>(c.num_seqs)} * c.context);
  for (int s = 0; s < c.num_seqs; ++s) {
    for (int t = 0; t < c.context; ++t) {
      pool.slots[size_t{static_cast<size_t>(s)} * c.context + t] = SlotOfPosition(
          &pool.tables[size_t{static_cast<size_t>(s)} * pool.blocks_per_seq], t, spec.block_size);
    }
  }
  CacheWriteParams write;
  write.cache = pool.Cache();
  write.k = w.k.data();
  write.v = w.v.data();
  write.slot_mapping = pool.slots.data();
  write.num_tokens = static_cast<int64_t>(pool.slots.size());
  RETURN_IF_ERROR(CacheWriteRef(write));
  return pool;
}

struct DecodeResult {
  std::vector<float> out;
  double v_rel_mse = 0.0;
};

absl::StatusOr<DecodeResult> Decode(const AccuracyConfig& c, const Workload& w, KvFormat k_format,
                                    KvFormat v_format) {
  ASSIGN_OR_RETURN(FilledPool pool, Fill(c, w, k_format, v_format));
  DecodeResult result;
  result.out.resize(w.q.size());
  RETURN_IF_ERROR(PagedDecodeRef(PagedDecodeParams{pool.Attention(c, w, result.out.data()), 0}));

  // Value reconstruction error, read back through the cache.
  const LayerCache cache = pool.Cache();
  double err = 0.0, ref = 0.0;
  std::vector<float> back(c.head_dim);
  for (int64_t t = 0; t < static_cast<int64_t>(pool.slots.size()); t += 7) {
    const int64_t slot = pool.slots[t];
    const int64_t block = slot / cache.block_size;
    const int in_block = static_cast<int>(slot % cache.block_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      DecodeHead(cache.v_codec, cache.VData(block, in_block, h), cache.VScale(block, in_block, h),
                 c.head_dim, back.data());
      for (int e = 0; e < c.head_dim; ++e) {
        const double x = Bf16ToFloat(w.v[(t * c.num_kv_heads + h) * c.head_dim + e]);
        err += (back[e] - x) * (back[e] - x);
        ref += x * x;
      }
    }
  }
  result.v_rel_mse = err / ref;
  return result;
}

// ‖got − want‖ / ‖want‖ over all outputs.
double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    ref += double{want[i]} * want[i];
  }
  return std::sqrt(err / ref);
}

// fp8_e4m3 K + turbo3 V decoded with the operands of Q·Kᵀ and P·V rounded to E4M3 in turn, then
// all of them, against the reference's float math over the same cache and against bf16 K/V.
absl::StatusOr<std::vector<Fp8MathRow>> Fp8MathRows(const AccuracyConfig& c, const Workload& w,
                                                    const std::vector<float>& bf16_out) {
  ASSIGN_OR_RETURN(FilledPool pool, Fill(c, w, KvFormat::kFp8E4m3, KvFormat::kTurbo3));
  std::vector<float> float_math(w.q.size()), out(w.q.size());
  RETURN_IF_ERROR(PagedDecodeRef(PagedDecodeParams{pool.Attention(c, w, float_math.data()), 0}));
  const std::pair<const char*, Fp8Operands> variants[] = {
      {"none", {}},
      {"Q", {.q = true}},
      {"P", {.p = true}},
      {"V", {.v = true}},
      {"Q, P, V", {.q = true, .p = true, .v = true}}};
  std::vector<Fp8MathRow> rows;
  for (const auto& [name, operands] : variants) {
    std::fprintf(stderr, "accuracy: fp8_e4m3 + turbo3 with %s in E4M3\n", name);
    RETURN_IF_ERROR(Fp8MathAttention(pool.Attention(c, w, out.data()), operands));
    rows.push_back({name, RelL2(out, float_math), RelL2(out, bf16_out)});
  }
  return rows;
}

// Largest softmax weight of each query head, averaged: 1 = one-hot, 1/context = flat.
double MeanTopWeight(const AccuracyConfig& c, const Workload& w) {
  const float scale = DefaultSoftmaxScale(c.head_dim);
  const int group = c.num_q_heads / c.num_kv_heads;
  const size_t row = size_t{static_cast<size_t>(c.num_kv_heads)} * c.head_dim;
  double total = 0.0;
  std::vector<double> logits(c.context);
  for (int s = 0; s < c.num_seqs; ++s) {
    for (int qh = 0; qh < c.num_q_heads; ++qh) {
      const Bf16* q = &w.q[(size_t{static_cast<size_t>(s)} * c.num_q_heads + qh) * c.head_dim];
      for (int t = 0; t < c.context; ++t) {
        const Bf16* k = &w.k[(size_t{static_cast<size_t>(s)} * c.context + t) * row +
                             size_t{static_cast<size_t>(qh / group)} * c.head_dim];
        double dot = 0.0;
        for (int e = 0; e < c.head_dim; ++e) dot += double{Bf16ToFloat(q[e])} * Bf16ToFloat(k[e]);
        logits[t] = dot * scale;
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      double z = 0.0;
      for (double l : logits) z += std::exp(l - m);
      total += 1.0 / z;
    }
  }
  return total / (c.num_seqs * c.num_q_heads);
}

}  // namespace

absl::StatusOr<AccuracyReport> RunAccuracy(const AccuracyConfig& config) {
  AccuracyReport report;
  report.config = config;
  std::fprintf(stderr, "accuracy: generating %d sequences x %d tokens\n", config.num_seqs,
               config.context);
  const Workload w = MakeWorkload(config);
  report.mean_top_weight = MeanTopWeight(config, w);
  ASSIGN_OR_RETURN(const DecodeResult reference,
                   Decode(config, w, KvFormat::kBf16, KvFormat::kBf16));

  const std::pair<KvFormat, KvFormat> pairs[] = {
      {KvFormat::kBf16, KvFormat::kBf16},      {KvFormat::kFp8E4m3, KvFormat::kBf16},
      {KvFormat::kBf16, KvFormat::kTurbo4},    {KvFormat::kBf16, KvFormat::kTurbo3},
      {KvFormat::kBf16, KvFormat::kTurbo2},    {KvFormat::kFp8E4m3, KvFormat::kTurbo4},
      {KvFormat::kFp8E4m3, KvFormat::kTurbo3}, {KvFormat::kFp8E4m3, KvFormat::kTurbo2}};
  const int64_t bf16_bytes = 2 * TraitsOf(KvFormat::kBf16).TotalBytes(config.head_dim);
  int done = 0;
  for (const auto& [k_format, v_format] : pairs) {
    std::fprintf(stderr, "accuracy: [%d/%zu] k=%s v=%s\n", ++done, std::size(pairs),
                 std::string(KvFormatName(k_format)).c_str(),
                 std::string(KvFormatName(v_format)).c_str());
    ASSIGN_OR_RETURN(const DecodeResult r, Decode(config, w, k_format, v_format));
    AccuracyRow row;
    row.k_format = k_format;
    row.v_format = v_format;
    row.bytes_per_token_head = TraitsOf(k_format).TotalBytes(config.head_dim) +
                               TraitsOf(v_format).TotalBytes(config.head_dim);
    row.compression_vs_bf16 = static_cast<double>(bf16_bytes) / row.bytes_per_token_head;
    row.v_rel_mse = r.v_rel_mse;
    OutputErrors errors;
    const int d = config.head_dim;
    for (size_t o = 0; o < r.out.size(); o += d) {
      const std::vector<double> got(r.out.begin() + o, r.out.begin() + o + d);
      const std::vector<double> want(reference.out.begin() + o, reference.out.begin() + o + d);
      errors.Add(got, want);
    }
    row.output_rel_l2 = errors.rel_l2();
    row.output_rel_l2_p99 = errors.rel_l2_p99();
    row.min_cosine = errors.min_cosine();
    report.rows.push_back(row);
  }
  ASSIGN_OR_RETURN(report.fp8_math, Fp8MathRows(config, w, reference.out));
  ASSIGN_OR_RETURN(report.mla, RunMlaAccuracy(config));
  return report;
}

std::string AccuracyTable(const AccuracyReport& r) {
  std::string out = absl::StrFormat(
      "attention output vs bf16 K/V: %d seqs x %d tokens, %d q / %d kv heads, head_dim %d "
      "(mean top softmax weight %.3f)\n\n",
      r.config.num_seqs, r.config.context, r.config.num_q_heads, r.config.num_kv_heads,
      r.config.head_dim, r.mean_top_weight);
  absl::StrAppend(
      &out,
      "| K | V | bytes/token-head | vs bf16 | output rel. L2 | p99 | min cosine | V rel. MSE |\n");
  absl::StrAppend(&out, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const AccuracyRow& row : r.rows) {
    absl::StrAppend(
        &out, absl::StrFormat("| %s | %s | %d | %.2fx | %.4f | %.4f | %.5f | %.5f |\n",
                              KvFormatName(row.k_format), KvFormatName(row.v_format),
                              row.bytes_per_token_head, row.compression_vs_bf16, row.output_rel_l2,
                              row.output_rel_l2_p99, row.min_cosine, row.v_rel_mse));
  }
  absl::StrAppend(&out,
                  "\nfp8_e4m3 K + turbo3 V with operands of Q·Kᵀ and P·V rounded to E4M3 (FP8 "
                  "tensor math)\n\n| in E4M3 | rel. L2 vs float math | rel. L2 vs bf16 K/V |\n"
                  "| --- | ---: | ---: |\n");
  for (const Fp8MathRow& row : r.fp8_math) {
    absl::StrAppend(&out, absl::StrFormat("| %s | %.4f | %.4f |\n", row.operands,
                                          row.rel_l2_vs_float_math, row.rel_l2_vs_bf16));
  }
  const MlaAccuracy& m = r.mla;
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "\nMLA pool (fp8_ds_mla) vs bf16 latents, %d heads, sparse MLA decode over every "
          "token\n\n| bytes/token | vs bf16 | output rel. L2 | p99 | min cosine | latent rel. MSE |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: |\n| %d | %.2fx | %.4f | %.4f | %.5f | %.5f |\n",
          m.heads, m.bytes_per_token, double(m.bf16_bytes_per_token) / m.bytes_per_token,
          m.output_rel_l2, m.output_rel_l2_p99, m.min_cosine, m.latent_rel_mse));
  return out;
}

std::string AccuracyJson(const AccuracyReport& r, const std::string& date,
                         const std::string& host) {
  std::string out = absl::StrFormat(
      "{\n  \"benchmark\": \"accuracy\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n"
      "  \"device\": \"cpu (reference kernels)\",\n"
      "  \"config\": {\"num_seqs\": %d, \"context\": %d, \"num_q_heads\": %d, \"num_kv_heads\": "
      "%d, "
      "\"head_dim\": %d, \"seed\": %d},\n  \"mean_top_softmax_weight\": %.6f,\n  \"rows\": [\n",
      date, host, r.config.num_seqs, r.config.context, r.config.num_q_heads, r.config.num_kv_heads,
      r.config.head_dim, r.config.seed, r.mean_top_weight);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const AccuracyRow& row = r.rows[i];
    absl::StrAppend(
        &out, absl::StrFormat(
                  "    {\"k\": \"%s\", \"v\": \"%s\", \"bytes_per_token_head\": %d, "
                  "\"compression_vs_bf16\": %.4f, \"output_rel_l2\": %.6g, "
                  "\"output_rel_l2_p99\": %.6g, \"min_cosine\": %.8f, \"v_rel_mse\": %.6g}%s\n",
                  KvFormatName(row.k_format), KvFormatName(row.v_format), row.bytes_per_token_head,
                  row.compression_vs_bf16, row.output_rel_l2, row.output_rel_l2_p99, row.min_cosine,
                  row.v_rel_mse, i + 1 < r.rows.size() ? "," : ""));
  }
  absl::StrAppend(&out, "  ],\n  \"fp8_math\": [\n");
  for (size_t i = 0; i < r.fp8_math.size(); ++i) {
    const Fp8MathRow& row = r.fp8_math[i];
    absl::StrAppend(&out,
                    absl::StrFormat("    {\"e4m3_operands\": \"%s\", \"rel_l2_vs_float_math\": "
                                    "%.6g, \"rel_l2_vs_bf16\": %.6g}%s\n",
                                    row.operands, row.rel_l2_vs_float_math, row.rel_l2_vs_bf16,
                                    i + 1 < r.fp8_math.size() ? "," : ""));
  }
  const MlaAccuracy& m = r.mla;
  absl::StrAppend(&out, absl::StrFormat(
                            "  ],\n  \"mla\": {\"format\": \"fp8_ds_mla\", \"heads\": %d, "
                            "\"bytes_per_token\": %d, \"bf16_bytes_per_token\": %d, "
                            "\"output_rel_l2\": %.6g, \"output_rel_l2_p99\": %.6g, "
                            "\"min_cosine\": %.8f, \"latent_rel_mse\": %.6g}\n}\n",
                            m.heads, m.bytes_per_token, m.bf16_bytes_per_token, m.output_rel_l2,
                            m.output_rel_l2_p99, m.min_cosine, m.latent_rel_mse));
  return out;
}

}  // namespace kvp::bench
