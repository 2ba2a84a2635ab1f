// What one operation of a backend handles (kernels/capabilities.h holds the tables): formats as a
// bit set over KvFormat, head dims as a bit set over kHeadDims. nvcc-safe.
#pragma once

#include <initializer_list>

#include "kvpool/format/kv_format.h"

namespace kvp {

// Formats as a bit set over KvFormat.
struct FormatSet {
  unsigned bits = 0;
  constexpr bool Has(KvFormat f) const { return (bits >> static_cast<unsigned>(f)) & 1u; }
  constexpr FormatSet With(KvFormat f) const { return {bits | (1u << static_cast<unsigned>(f))}; }
  constexpr FormatSet And(FormatSet o) const { return {bits & o.bits}; }
};

constexpr FormatSet FormatsOf(std::initializer_list<KvFormat> formats) {
  FormatSet s;
  for (KvFormat f : formats) s = s.With(f);
  return s;
}

inline constexpr int kHeadDims[] = {64, 128, 256};
inline constexpr unsigned kAllHeadDims = 0b111;

// One operation's reach: the K and V formats and head dims it handles (with or without the
// indexer sections: every backend's indexer kernels serve every pool that has them).
struct OpCapabilities {
  FormatSet k_formats, v_formats;
  unsigned head_dims = 0;  // bit i: kHeadDims[i]
  bool mla = false;        // MLA pools (their latent has one format and shape)

  constexpr bool HasHeadDim(int d) const {
    for (int i = 0; i < 3; ++i) {
      if (kHeadDims[i] == d) return (head_dims >> i) & 1u;
    }
    return false;
  }
  constexpr bool Serves(KvFormat k, KvFormat v, int head_dim) const {
    return k_formats.Has(k) && v_formats.Has(v) && HasHeadDim(head_dim);
  }
  constexpr OpCapabilities And(const OpCapabilities& o) const {
    return {k_formats.And(o.k_formats), v_formats.And(o.v_formats), head_dims & o.head_dims,
            mla && o.mla};
  }
};

}  // namespace kvp
