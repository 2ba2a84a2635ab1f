#include "kvpool/layout/pool_spec.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kvpool/format/kv_format_names.h"
#include "kvpool/format/mla_latent.h"

namespace kvp {
namespace {

absl::Status ValidateScales(const std::vector<float>& scales, int num_layers, const char* name) {
  if (scales.empty()) return absl::OkStatus();
  if (static_cast<int>(scales.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " has ", scales.size(), " entries; expected one per layer (", num_layers, ")"));
  }
  for (size_t l = 0; l < scales.size(); ++l) {
    if (!std::isfinite(scales[l]) || scales[l] <= 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", l, "] = ", scales[l], "; must be finite and positive"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int PoolSpec::InputDim() const { return mla() ? kMlaInputDim : head_dim; }

PoolSpec MlaPoolSpec(int num_layers, int block_size, bool indexer_ue8m0) {
  PoolSpec spec;
  spec.kind = PoolKind::kMla;
  spec.num_layers = num_layers;
  spec.num_kv_heads = 1;
  spec.head_dim = kMlaLatentDim;
  spec.block_size = block_size;
  spec.indexer = true;
  spec.indexer_ue8m0 = indexer_ue8m0;
  return spec;
}

const char* PoolKindName(PoolKind kind) { return kind == PoolKind::kMla ? "mla" : "kv"; }

absl::StatusOr<PoolKind> ParsePoolKind(std::string_view name) {
  if (name == "kv") return PoolKind::kKv;
  if (name == "mla") return PoolKind::kMla;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown pool kind '", std::string(name), "'; use kv or mla"));
}

std::string PoolSpec::DebugString() const {
  if (mla()) {
    return absl::StrCat("kind=mla layers=", num_layers, " block=", block_size,
                        " latent=fp8_ds_mla indexer=", indexer, " ue8m0=", indexer_ue8m0);
  }
  return absl::StrCat("layers=", num_layers, " kv_heads=", num_kv_heads, " head_dim=", head_dim,
                      " block=", block_size, " k=", KvFormatName(k_format),
                      " v=", KvFormatName(v_format), " v_rotation=", v_rotation,
                      " indexer=", indexer, " ue8m0=", indexer_ue8m0);
}

absl::Status ValidatePoolSpec(const PoolSpec& spec) {
  if (spec.num_layers < 1 || spec.num_layers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers = ", spec.num_layers, "; must be in [1, 1024]"));
  }
  if (spec.block_size != 16 && spec.block_size != 32 && spec.block_size != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size = ", spec.block_size, "; must be 16, 32 or 64"));
  }
  if (spec.mla()) {
    // Everything but the layers, the block size and the indexer's scales is fixed by the format.
    if (spec != MlaPoolSpec(spec.num_layers, spec.block_size, spec.indexer_ue8m0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an MLA pool has one latent head of ", kMlaLatentDim, " values, an indexer, default K/V "
          "fields and no per-layer scales; got ", spec.DebugString(), " kv_heads=",
          spec.num_kv_heads, " head_dim=", spec.head_dim));
    }
    return absl::OkStatus();
  }
  if (spec.kind != PoolKind::kKv) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown pool kind ", static_cast<int>(spec.kind)));
  }
  if (spec.num_kv_heads < 1 || spec.num_kv_heads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads = ", spec.num_kv_heads, "; must be in [1, 256]"));
  }
  if (!IsSupportedHeadDim(spec.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim = ", spec.head_dim, "; must be 64, 128 or 256"));
  }
  if (!TraitsOf(spec.k_format).k_capable) {
    return absl::UnimplementedError(absl::StrCat("k_format ", KvFormatName(spec.k_format),
                                                 " cannot hold keys; use bf16 or fp8_e4m3"));
  }
  if (!TraitsOf(spec.v_format).v_capable) {
    return absl::UnimplementedError(absl::StrCat("v_format ", KvFormatName(spec.v_format),
                                                 " cannot hold values; use bf16 or turbo2/3/4"));
  }
  if (auto s = ValidateScales(spec.k_scales, spec.num_layers, "k_scales"); !s.ok()) return s;
  return ValidateScales(spec.v_scales, spec.num_layers, "v_scales");
}

}  // namespace kvp
