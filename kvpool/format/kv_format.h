// Cache formats as data (docs/design.md §3): one enum, one traits table. A format's byte sizes come
// from here and nowhere else; adding a bit width is one enum value, one traits row, one dispatch
// case. nvcc-safe (no Abseil); names and parsing live in kv_format_names.h.
#pragma once

#include <cstdint>

#include "base/hd.h"

namespace kvp {

enum class KvFormat : uint8_t {
  kBf16 = 0,     // K or V, uncompressed (comparison runs)
  kFp8E4m3 = 1,  // K: E4M3(k / k_scale)
  kTurbo2 = 2,   // V: TurboNV, 2-bit codes + E4M3 scale per 16
  kTurbo3 = 3,   // V: TurboNV, 3-bit codes
  kTurbo4 = 4,   // V: TurboNV, 4-bit codes
  kIndexer = 5,  // index keys: E4M3 values + float32 scale per 128 (UE8M0 by default)
};

inline constexpr int kNumKvFormats = 6;

struct FormatTraits {
  int value_bits;   // bits per stored element (code)
  int group_size;   // elements per scale; 0 = no scale
  int scale_bytes;  // bytes per scale
  bool k_capable;   // may hold the K cache
  bool v_capable;   // may hold the V cache
  bool turbo;       // TurboNV: rotation + Lloyd-Max codes

  // Bytes of one token-head vector of `d` elements: codes, then scales (separate sections).
  KVP_HD constexpr int64_t DataBytes(int d) const { return int64_t{d} * value_bits / 8; }
  KVP_HD constexpr int64_t ScaleBytes(int d) const {
    return group_size == 0 ? 0 : int64_t{d} / group_size * scale_bytes;
  }
  KVP_HD constexpr int64_t TotalBytes(int d) const { return DataBytes(d) + ScaleBytes(d); }
};

KVP_HD constexpr FormatTraits TraitsOf(KvFormat f) {
  switch (f) {
    case KvFormat::kBf16:
      return {16, 0, 0, true, true, false};
    case KvFormat::kFp8E4m3:
      return {8, 0, 0, true, false, false};
    case KvFormat::kTurbo2:
      return {2, 16, 1, false, true, true};
    case KvFormat::kTurbo3:
      return {3, 16, 1, false, true, true};
    case KvFormat::kTurbo4:
      return {4, 16, 1, false, true, true};
    case KvFormat::kIndexer:
      return {8, 128, 4, false, false, false};
  }
  return {0, 0, 0, false, false, false};
}

static_assert(TraitsOf(KvFormat::kTurbo2).TotalBytes(128) == 40);
static_assert(TraitsOf(KvFormat::kTurbo3).TotalBytes(128) == 56);
static_assert(TraitsOf(KvFormat::kTurbo4).TotalBytes(128) == 72);
static_assert(TraitsOf(KvFormat::kIndexer).TotalBytes(128) == 132);

// Head dims every K/V format supports: multiples of the TurboNV group and powers of two (rotation).
KVP_HD constexpr bool IsSupportedHeadDim(int d) { return d == 64 || d == 128 || d == 256; }

}  // namespace kvp
