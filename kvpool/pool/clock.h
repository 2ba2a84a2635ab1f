// Clock: the time seam of the pool. Leases expire by it; tests drive a FakeClock instead of
// sleeping.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvp {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() const = 0;
};

// CLOCK_MONOTONIC through std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  int64_t NowMicros() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// Time that moves only when told to. Not thread-safe.
class FakeClock final : public Clock {
 public:
  int64_t NowMicros() const override { return now_; }
  void Advance(int64_t micros) { now_ += micros; }

 private:
  int64_t now_ = 1'000'000;
};

}  // namespace kvp
