#include "kernels/common/fast_divisor.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvp {
namespace {

TEST(FastDivisorTest, QuotientsEqualIntegerDivisionAcrossTheWholeRange) {
  std::mt19937 rng(11);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1024; ++d) divisors.push_back(d);
  for (uint32_t d :
       {65535u, 65536u, 65537u, 1u << 31, (1u << 31) + 1, UINT32_MAX - 1, UINT32_MAX}) {
    divisors.push_back(d);
  }
  for (int i = 0; i < 200; ++i) divisors.push_back(rng() | 1u);
  for (uint32_t d : divisors) {
    const FastDivisor divisor(d);
    EXPECT_EQ(divisor.divisor(), d);
    std::vector<uint32_t> numerators = {0, 1, d - 1, d, UINT32_MAX, UINT32_MAX - 1, UINT32_MAX - d};
    for (uint64_t q = UINT32_MAX / d; q > 0 && numerators.size() < 40; q /= 3) {
      numerators.push_back(static_cast<uint32_t>(q * d));  // exact multiples and their neighbours
      numerators.push_back(static_cast<uint32_t>(q * d - 1));
    }
    for (int i = 0; i < 200; ++i) numerators.push_back(rng());
    for (uint32_t n : numerators) {
      ASSERT_EQ(divisor.Divide(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace kvp
