// Random and shaped inputs that the tests and the benchmarks (kvpool-bench) both build, so that a
// case a test checks and a row the bench times are made the same way.
#pragma once

#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include "kvpool/format/bf16.h"

namespace kvp::testing {

// Normal(0, stddev) values rounded to bf16.
std::vector<Bf16> RandomBf16(std::mt19937_64& rng, size_t n, float stddev = 1.0f);

// In each row of `stride` scores, raises the (k+1)-th largest to the k-th largest: a tie at the
// boundary, which top-k's search cannot settle with two histogram passes. REQUIRES: k < stride,
// no NaN.
void TieAtTheKth(std::span<float> scores, int stride, int k);

}  // namespace kvp::testing
