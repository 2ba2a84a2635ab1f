#include "protocol/capabilities_codec.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "kvpool/format/kv_format_names.h"
#include "protocol/spec_codec.h"

namespace kvp {
namespace {

std::vector<KvFormat> Members(FormatSet set) {
  std::vector<KvFormat> formats;
  for (int f = 0; f < kNumKvFormats; ++f) {
    if (set.Has(static_cast<KvFormat>(f))) formats.push_back(static_cast<KvFormat>(f));
  }
  return formats;
}

void FillFormats(const std::vector<KvFormat>& formats, capnp::List<wire::KvFormat>::Builder out) {
  for (size_t i = 0; i < formats.size(); ++i) {
    out.set(static_cast<unsigned>(i), KvFormatToWire(formats[i]));
  }
}

FormatSet FormatsFromWire(capnp::List<wire::KvFormat>::Reader list) {
  FormatSet set;
  for (wire::KvFormat f : list) {
    if (absl::StatusOr<KvFormat> known = KvFormatFromWire(f); known.ok()) set = set.With(*known);
  }
  return set;
}

}  // namespace

void ServedToWire(const OpCapabilities& served, wire::ServedFormats::Builder out) {
  const std::vector<KvFormat> k = Members(served.k_formats), v = Members(served.v_formats);
  FillFormats(k, out.initKFormats(static_cast<unsigned>(k.size())));
  FillFormats(v, out.initVFormats(static_cast<unsigned>(v.size())));
  std::vector<int> dims;
  for (int d : kHeadDims) {
    if (served.HasHeadDim(d)) dims.push_back(d);
  }
  auto list = out.initHeadDims(static_cast<unsigned>(dims.size()));
  for (size_t i = 0; i < dims.size(); ++i) list.set(static_cast<unsigned>(i), dims[i]);
  out.setMla(served.mla);
}

OpCapabilities ServedFromWire(wire::ServedFormats::Reader in) {
  OpCapabilities served{FormatsFromWire(in.getKFormats()), FormatsFromWire(in.getVFormats()), 0,
                        in.getMla()};
  for (uint32_t d : in.getHeadDims()) {
    for (int i = 0; i < 3; ++i) {
      if (static_cast<uint32_t>(kHeadDims[i]) == d) served.head_dims |= 1u << i;
    }
  }
  return served;
}

absl::Status CheckServes(const OpCapabilities& served, const PoolSpec& spec) {
  if (spec.mla()) {
    if (served.mla) return absl::OkStatus();
    return absl::UnimplementedError("the worker cannot serve MLA pools");
  }
  if (!served.k_formats.Has(spec.k_format)) {
    return absl::UnimplementedError(absl::StrCat("the worker lacks the pool's K format ",
                                                 std::string(KvFormatName(spec.k_format))));
  }
  if (!served.v_formats.Has(spec.v_format)) {
    return absl::UnimplementedError(absl::StrCat("the worker lacks the pool's V format ",
                                                 std::string(KvFormatName(spec.v_format))));
  }
  if (!served.HasHeadDim(spec.head_dim)) {
    return absl::UnimplementedError(
        absl::StrCat("the worker lacks the pool's head_dim ", spec.head_dim));
  }
  return absl::OkStatus();
}

}  // namespace kvp
