// What the GPU kernel tests share: host <-> device copies, the fixture that skips without a GPU,
// and a test pool's arena, block tables and lengths on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/device_buffer.h"
#include "tests/testing/test_pool.h"

namespace kvp {

inline const float kNan = std::numeric_limits<float>::quiet_NaN();

template <typename T>
DeviceBuffer Up(const std::vector<T>& host) {
  return ToDevice(host).value();
}

template <typename T>
std::vector<T> Down(const DeviceBuffer& d, size_t n) {
  std::vector<T> host(n);
  EXPECT_TRUE(d.CopyTo(host).ok());
  return host;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU";
  }
  std::mt19937_64 rng_{std::random_device{}()};
};

struct DevicePool {
  DeviceBuffer arena, tables, lens;
  explicit DevicePool(testing::TestPool& pool)
      : arena(Up(pool.arena())), tables(Up(pool.block_tables())), lens(Up(pool.seq_lens())) {}
};

}  // namespace kvp
