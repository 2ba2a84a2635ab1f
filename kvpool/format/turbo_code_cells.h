// TurboCode by table lookup, for the GPU's cache write: the code and level that TurboCode and
// TurboLevel give (docs/design.md §3, step 2), for finite |u| <= kTurboCellReach, with one
// shared-memory load and one comparison instead of TurboCodeSelect's N comparisons and the selects
// between them.
//
// u·8192 + (2^33 + 32·1024) as one float operation leaves round(u·8) + 32 in the low bits of its
// result: u·8192 is exact, so the one rounding is to a multiple of 1024 (the spacing of floats from
// 2^33 to 2^34), and it never decreases as u grows. That integer names u's cell, 1/8 wide. No two
// boundaries share a cell (the closest, turbo4's around 0, are 0.258 apart; checked below), and a
// boundary in a lower cell is below u, one in a higher cell above it. So u's code is the number of
// boundaries in the cells below its own, plus one if u >= its cell's boundary; each cell holds that
// count, its boundary and the levels of both outcomes.
//
// 2^33's bits are 0x50000000: shifted left by 4 or more in 32 bits they vanish, so the shift that
// turns the result's bits into the offset of a cell of 16 bytes or more also drops the bias.
#pragma once

#include <cstdint>

#include "base/hd.h"
#include "kvpool/format/turbo_codebook.h"

namespace kvp {

inline constexpr int kTurboCells = 64;
inline constexpr int kTurboCellsPerUnit = 8;
inline constexpr float kTurboCellBias = 0x1p33f;
inline constexpr float kTurboCellSpacing = 1024.0f;  // of floats from 2^33 to 2^34
inline constexpr int kTurboCellOfZero = kTurboCells / 2;
// Cells 0 to 63 hold u·8 from -32.5 to 31.5.
inline constexpr float kTurboCellReach = 3.9f;

// u·8192 + (2^33 + 32·1024), one rounding: a fused multiply-add on the GPU.
KVP_HD constexpr float TurboCellBiased(float u) {
  constexpr float kScale = kTurboCellsPerUnit * kTurboCellSpacing;
  constexpr float kAddend = kTurboCellBias + kTurboCellOfZero * kTurboCellSpacing;
#ifdef __CUDA_ARCH__
  if (!__builtin_is_constant_evaluated()) return __fmaf_rn(u, kScale, kAddend);
#endif
  return u * kScale + kAddend;  // the product is exact, so this too rounds once
}

// Index of u's cell, for |u| <= kTurboCellReach.
KVP_HD constexpr uint32_t TurboCellOf(float u) {
  return __builtin_bit_cast(uint32_t, TurboCellBiased(u)) -
         __builtin_bit_cast(uint32_t, kTurboCellBias);
}
static_assert(__builtin_bit_cast(uint32_t, kTurboCellBias) << 4 == 0);

struct alignas(16) TurboCell {
  float boundary;     // the boundary inside the cell; +inf where there is none
  float level_below;  // TurboLevel(code_below)
  float level_above;  // TurboLevel(code_below + 1); level_below where there is no boundary
  int code_below;     // the code of the cell's values below `boundary`
};

template <int kBits>
struct TurboCells {
  TurboCell cell[kTurboCells];
};

template <int kBits>
KVP_HD constexpr TurboCells<kBits> MakeTurboCells() {
  constexpr int kLevels = TurboCodebook<kBits>::kLevels;
  TurboCells<kBits> cells{};
  for (uint32_t c = 0; c < kTurboCells; ++c) {
    TurboCell& cell = cells.cell[c];
    cell.boundary = __builtin_huge_valf();
    int above = 0;
    for (int j = 0; j + 1 < kLevels; ++j) {
      const float boundary = TurboBoundaryAt<kBits>(j);
      if (TurboCellOf(boundary) < c) cell.code_below = j + 1;
      if (TurboCellOf(boundary) == c) {
        cell.boundary = boundary;
        above = j + 1;
      }
    }
    if (cell.boundary == __builtin_huge_valf()) above = cell.code_below;
    cell.level_below = TurboCodebook<kBits>::Level(cell.code_below);
    cell.level_above = TurboCodebook<kBits>::Level(above);
  }
  return cells;
}

// What the lookup relies on: every value the encoder can produce (|u| <= the largest level, give
// or take its two roundings) lies inside the table, and no cell holds two boundaries.
template <int kBits>
constexpr bool TurboCellsAreSound() {
  constexpr float kMax = TurboCodebook<kBits>::Level(TurboCodebook<kBits>::kLevels - 1);
  // (Below cell 0 the index wraps around to a large unsigned number.)
  if (kMax * 1.001f > kTurboCellReach || TurboCellOf(-kTurboCellReach) > kTurboCells - 1 ||
      TurboCellOf(kTurboCellReach) > kTurboCells - 1) {
    return false;
  }
  for (int j = 0; j + 2 < TurboCodebook<kBits>::kLevels; ++j) {
    if (TurboCellOf(TurboBoundaryAt<kBits>(j)) == TurboCellOf(TurboBoundaryAt<kBits>(j + 1))) {
      return false;
    }
  }
  return true;
}
static_assert(TurboCellsAreSound<2>() && TurboCellsAreSound<3>() && TurboCellsAreSound<4>());

struct TurboCodeLevel {
  int code;
  float level;
};

// TurboCode(u) and its level from a cell; `cell` is cells[TurboCellOf(u)].
KVP_HD TurboCodeLevel TurboCodeInCell(const TurboCell& cell, float u) {
  const bool above = u >= cell.boundary;
  return {cell.code_below + (above ? 1 : 0), above ? cell.level_above : cell.level_below};
}

template <int kBits>
KVP_HD TurboCodeLevel TurboLookupCode(const TurboCells<kBits>& cells, float u) {
  return TurboCodeInCell(cells.cell[TurboCellOf(u)], u);
}

}  // namespace kvp
