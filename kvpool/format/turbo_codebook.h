// Gaussian Lloyd-Max codebooks of TurboNV (docs/design.md §3, step 2): for N bits, 2^N levels
// sorted ascending, code j <-> level j. Levels are the float32 values of the decimals below;
// boundaries are T_j = float32(C_j + C_{j+1}) · 0.5, computed with the same two float operations
// everywhere.
#pragma once

#include <array>

#include "base/hd.h"

namespace kvp {

inline constexpr int kTurboGroupSize = 16;

template <int kBits>
struct TurboCodebook;

template <>
struct TurboCodebook<2> {
  static constexpr int kLevels = 4;
  KVP_HD static constexpr float Level(int j) {
    constexpr float kC[kLevels] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
    return kC[j];
  }
};

template <>
struct TurboCodebook<3> {
  static constexpr int kLevels = 8;
  KVP_HD static constexpr float Level(int j) {
    constexpr float kC[kLevels] = {-2.1520f, -1.3440f, -0.7560f, -0.2451f,
                                   0.2451f,  0.7560f,  1.3440f,  2.1520f};
    return kC[j];
  }
};

template <>
struct TurboCodebook<4> {
  static constexpr int kLevels = 16;
  KVP_HD static constexpr float Level(int j) {
    constexpr float kC[kLevels] = {-2.7326f, -2.0690f, -1.6180f, -1.2562f, -0.9423f, -0.6568f,
                                   -0.3880f, -0.1284f, 0.1284f,  0.3880f,  0.6568f,  0.9423f,
                                   1.2562f,  1.6180f,  2.0690f,  2.7326f};
    return kC[j];
  }
};

// Level of a run-time code as a tree of selects over compile-time constants: no table in memory,
// so device code keeps it in registers.
template <int kBits, int kFirst = 0, int kCount = (1 << kBits)>
KVP_HD constexpr float TurboLevelSelect(int code) {
  if constexpr (kCount == 1) {
    return TurboCodebook<kBits>::Level(kFirst);
  } else {
    constexpr int kHalf = kCount / 2;
    return code < kFirst + kHalf ? TurboLevelSelect<kBits, kFirst, kHalf>(code)
                                 : TurboLevelSelect<kBits, kFirst + kHalf, kHalf>(code);
  }
}

// The levels as a table, for the host, where a load beats a chain of unpredictable branches.
template <int kBits>
struct TurboLevelTable {
  static constexpr auto kLevels = [] {
    std::array<float, (1 << kBits)> t{};
    for (int c = 0; c < (1 << kBits); ++c) t[c] = TurboCodebook<kBits>::Level(c);
    return t;
  }();
};

// Level of code `code` (0 <= code < 2^kBits): the same value on host and device.
template <int kBits>
KVP_HD constexpr float TurboLevel(int code) {
#ifdef __CUDA_ARCH__
  return TurboLevelSelect<kBits>(code);
#else
  return TurboLevelTable<kBits>::kLevels[code];
#endif
}

// Boundary between code j and code j + 1: float32(C_j + C_{j+1}) · 0.5, each step one IEEE
// single-precision operation, evaluated at compile time (constant evaluation rounds like the
// hardware: to nearest even).
template <int kBits>
KVP_HD constexpr float TurboBoundaryAt(int j) {
  return (TurboCodebook<kBits>::Level(j) + TurboCodebook<kBits>::Level(j + 1)) * 0.5f;
}

template <int kBits, int kJ>
KVP_HD constexpr float TurboBoundary() {
  constexpr float kBoundary = TurboBoundaryAt<kBits>(kJ);
  return kBoundary;
}

// Code of u: the number of boundaries T_j with u >= T_j (ties go up). NaN gives 0. The boundaries
// are sorted, so a binary search over codes [kFirst, kFirst + kCount) finds it with N comparisons
// instead of 2^N - 1 (NaN fails every comparison and ends at 0).
template <int kBits, int kFirst = 0, int kCount = (1 << kBits)>
KVP_HD int TurboCode(float u) {
  if constexpr (kCount == 1) {
    return kFirst;
  } else {
    constexpr int kHalf = kCount / 2;
    return u >= TurboBoundary<kBits, kFirst + kHalf - 1>()
               ? TurboCode<kBits, kFirst + kHalf, kHalf>(u)
               : TurboCode<kBits, kFirst, kHalf>(u);
  }
}

// The boundary TurboCode compares with at bit kBit of its search, given its decisions `up` at the
// bits above: T_(above + 2^kBit - 1), picked by selects on those decisions.
template <int kBits, int kBit, int kHigh = kBits - 1, int kAbove = 0>
KVP_HD float TurboSearchBoundary(const bool* up) {
  if constexpr (kHigh == kBit) {
    return TurboBoundary<kBits, kAbove + (1 << kBit) - 1>();
  } else {
    return up[kHigh] ? TurboSearchBoundary<kBits, kBit, kHigh - 1, kAbove | (1 << kHigh)>(up)
                     : TurboSearchBoundary<kBits, kBit, kHigh - 1, kAbove>(up);
  }
}

// Sets up[kBit], then the bits below it: whether u is at or above the boundary of each step.
template <int kBits, int kBit = kBits - 1>
KVP_HD void TurboSearch(float u, bool* up) {
  up[kBit] = u >= TurboSearchBoundary<kBits, kBit>(up);
  if constexpr (kBit > 0) TurboSearch<kBits, kBit - 1>(u, up);
}

// TurboCode without jumps, for the GPU, where the lanes of a warp go both ways at every
// comparison: the same search (the same comparisons with the same boundaries, so the same code,
// NaN included), each boundary chosen by selects on the decisions before it. The decisions stay
// predicates; the code is assembled from them once at the end.
template <int kBits>
KVP_HD int TurboCodeSelect(float u) {
  bool up[kBits];
  TurboSearch<kBits>(u, up);
  int code = 0;
  for (int b = 0; b < kBits; ++b) code += up[b] ? (1 << b) : 0;
  return code;
}

template <int kBits>
KVP_HD constexpr float TurboMaxLevel() {
  return TurboCodebook<kBits>::Level(TurboCodebook<kBits>::kLevels - 1);
}

}  // namespace kvp
