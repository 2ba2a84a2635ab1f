// Softmax in the log2 domain, where exp2f and log2f are one instruction each: scores are scaled
// by log2(e) before exp2, and a log-sum-exp kept in log2 units returns to natural ones times ln 2.
#pragma once

namespace kvp {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

}  // namespace kvp
