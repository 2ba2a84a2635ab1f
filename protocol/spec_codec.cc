#include "protocol/spec_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kvp {

// The wire enum and KvFormat share their numbers; these keep the two in step.
static_assert(static_cast<int>(wire::KvFormat::BF16) == static_cast<int>(KvFormat::kBf16));
static_assert(static_cast<int>(wire::KvFormat::FP8_E4M3) == static_cast<int>(KvFormat::kFp8E4m3));
static_assert(static_cast<int>(wire::KvFormat::TURBO2) == static_cast<int>(KvFormat::kTurbo2));
static_assert(static_cast<int>(wire::KvFormat::TURBO3) == static_cast<int>(KvFormat::kTurbo3));
static_assert(static_cast<int>(wire::KvFormat::TURBO4) == static_cast<int>(KvFormat::kTurbo4));
static_assert(static_cast<int>(wire::KvFormat::INDEXER) == static_cast<int>(KvFormat::kIndexer));
static_assert(kNumKvFormats == 6, "a new format needs its wire enumerant and an assert here");

wire::KvFormat KvFormatToWire(KvFormat f) { return static_cast<wire::KvFormat>(f); }

absl::StatusOr<KvFormat> KvFormatFromWire(wire::KvFormat f) {
  const auto n = static_cast<int>(f);
  if (n < 0 || n >= kNumKvFormats) {
    return absl::InvalidArgumentError(absl::StrCat("unknown format number ", n));
  }
  return static_cast<KvFormat>(n);
}

static_assert(static_cast<int>(wire::PoolKind::KV) == static_cast<int>(PoolKind::kKv));
static_assert(static_cast<int>(wire::PoolKind::MLA) == static_cast<int>(PoolKind::kMla));
static_assert(kNumPoolKinds == 2, "a new pool kind needs its wire enumerant and an assert here");

void ModelConfigToWire(const ModelConfig& model, wire::Model::Builder out) {
  out.setNumQHeads(static_cast<uint32_t>(model.num_q_heads));
  out.setTopk(static_cast<uint32_t>(model.topk));
  out.setSyntheticSeed(model.synthetic_seed);
  auto windows = out.initSlidingWindows(static_cast<unsigned>(model.sliding_windows.size()));
  for (size_t l = 0; l < model.sliding_windows.size(); ++l) {
    windows.set(static_cast<unsigned>(l), static_cast<uint32_t>(model.sliding_windows[l]));
  }
  out.setSparseVThreshold(model.sparse_v_threshold);
  out.setSoftmaxScale(model.softmax_scale);
}

ModelConfig ModelConfigFromWire(wire::Model::Reader in) {
  ModelConfig model{.num_q_heads = static_cast<int>(in.getNumQHeads()),
                    .topk = static_cast<int>(in.getTopk()),
                    .synthetic_seed = in.getSyntheticSeed(),
                    .sliding_windows = {},
                    .sparse_v_threshold = in.getSparseVThreshold(),
                    .softmax_scale = in.getSoftmaxScale()};
  for (uint32_t w : in.getSlidingWindows()) {
    // A window past INT32_MAX attends to everything anyway.
    model.sliding_windows.push_back(static_cast<int>(std::min<uint32_t>(w, INT32_MAX)));
  }
  return model;
}

void PoolSpecToWire(const PoolSpec& spec, wire::PoolSpec::Builder out) {
  out.setKind(static_cast<wire::PoolKind>(spec.kind));
  out.setNumLayers(spec.num_layers);
  out.setNumKvHeads(spec.num_kv_heads);
  out.setHeadDim(spec.head_dim);
  out.setBlockSize(spec.block_size);
  out.setKFormat(KvFormatToWire(spec.k_format));
  out.setVFormat(KvFormatToWire(spec.v_format));
  out.setVRotation(spec.v_rotation);
  out.setIndexer(spec.indexer);
  out.setIndexerUe8m0(spec.indexer_ue8m0);
  auto k = out.initKScales(spec.k_scales.size());
  for (size_t i = 0; i < spec.k_scales.size(); ++i) k.set(i, spec.k_scales[i]);
  auto v = out.initVScales(spec.v_scales.size());
  for (size_t i = 0; i < spec.v_scales.size(); ++i) v.set(i, spec.v_scales[i]);
}

absl::StatusOr<PoolSpec> PoolSpecFromWire(wire::PoolSpec::Reader in) {
  PoolSpec spec;
  const auto kind = static_cast<int>(in.getKind());
  if (kind < 0 || kind >= kNumPoolKinds) {
    return absl::InvalidArgumentError(absl::StrCat("unknown pool kind number ", kind));
  }
  spec.kind = static_cast<PoolKind>(kind);
  spec.num_layers = static_cast<int>(in.getNumLayers());
  spec.num_kv_heads = static_cast<int>(in.getNumKvHeads());
  spec.head_dim = static_cast<int>(in.getHeadDim());
  spec.block_size = static_cast<int>(in.getBlockSize());
  ASSIGN_OR_RETURN(spec.k_format, KvFormatFromWire(in.getKFormat()));
  ASSIGN_OR_RETURN(spec.v_format, KvFormatFromWire(in.getVFormat()));
  spec.v_rotation = in.getVRotation();
  spec.indexer = in.getIndexer();
  spec.indexer_ue8m0 = in.getIndexerUe8m0();
  for (float s : in.getKScales()) spec.k_scales.push_back(s);
  for (float s : in.getVScales()) spec.v_scales.push_back(s);
  RETURN_IF_ERROR(ValidatePoolSpec(spec));
  return spec;
}

}  // namespace kvp
