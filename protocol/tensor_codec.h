// Dense tensors on the wire (wire::Tensor): dtype, shape and little-endian row-major bytes.
// Readers check dtype, shape and byte count against what the caller expects and copy the values
// out, so nothing downstream reads a message's memory or trusts its sizes.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/format/bf16.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

template <typename T>
struct WireDType;
template <>
struct WireDType<Bf16> {
  static constexpr wire::DType kValue = wire::DType::BF16;
};
template <>
struct WireDType<float> {
  static constexpr wire::DType kValue = wire::DType::FLOAT32;
};
template <>
struct WireDType<int32_t> {
  static constexpr wire::DType kValue = wire::DType::INT32;
};
template <>
struct WireDType<int64_t> {
  static constexpr wire::DType kValue = wire::DType::INT64;
};

std::string_view DTypeName(wire::DType dtype);

// Checks dtype and shape of `tensor` against the expectation; `what` names it in errors
// ("layer 3 k"). INVALID_ARGUMENT on any mismatch, including a data size that does not match.
absl::Status CheckTensor(wire::Tensor::Reader tensor, wire::DType dtype,
                         std::span<const uint32_t> shape, std::string_view what);

template <typename T>
void SetTensor(wire::Tensor::Builder out, std::initializer_list<uint32_t> shape,
               std::span<const T> values) {
  out.setDtype(WireDType<T>::kValue);
  auto dims = out.initShape(static_cast<unsigned>(shape.size()));
  unsigned i = 0;
  for (uint32_t d : shape) dims.set(i++, d);
  auto data = out.initData(values.size_bytes());
  std::memcpy(data.begin(), values.data(), values.size_bytes());
}

// The values of a tensor of exactly `shape` and type T, copied out.
template <typename T>
absl::StatusOr<std::vector<T>> TensorValues(wire::Tensor::Reader tensor,
                                            std::initializer_list<uint32_t> shape,
                                            std::string_view what) {
  const std::vector<uint32_t> dims(shape);
  if (absl::Status s = CheckTensor(tensor, WireDType<T>::kValue, dims, what); !s.ok()) return s;
  const auto data = tensor.getData();
  std::vector<T> values(data.size() / sizeof(T));
  std::memcpy(values.data(), data.begin(), data.size());
  return values;
}

}  // namespace kvp
