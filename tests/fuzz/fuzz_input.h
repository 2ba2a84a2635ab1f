// The fuzzer's bytes as a stream of choices (a small stand-in for clang's FuzzedDataProvider, so
// that the targets also build with g++ and replay their corpora as tests). Past the end it
// returns zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvp::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A value in [0, n); n > 0.
  uint32_t Below(uint32_t n) {
    uint32_t v = Byte();
    if (n > 256) v = (v << 8) | Byte();
    if (n > 65536) v = (v << 8) | Byte();
    return v % n;
  }
  bool Bit() { return (Byte() & 1) != 0; }
  // What is left, as a string.
  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_) + pos_, done() ? 0 : size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kvp::fuzz
