// bfloat16 as raw bits: layout-compatible with __nv_bfloat16 and torch.bfloat16, usable in the
// params structs that both the CPU references and the CUDA kernels take.
#pragma once

#include <cstdint>

#include "base/hd.h"

namespace kvp {

struct Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

KVP_HD float Bf16ToFloat(Bf16 h) { return BitsToFloat(static_cast<uint32_t>(h.bits) << 16); }

// Round to nearest even; NaN becomes a quiet NaN with its sign.
KVP_HD Bf16 Bf16FromFloat(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

}  // namespace kvp
