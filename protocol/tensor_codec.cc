#include "protocol/tensor_codec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvp {
namespace {

size_t DTypeBytes(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::BF16:
      return 2;
    case wire::DType::FLOAT32:
    case wire::DType::INT32:
      return 4;
    case wire::DType::INT64:
      return 8;
  }
  return 0;
}

}  // namespace

std::string_view DTypeName(wire::DType dtype) {
  switch (dtype) {
    case wire::DType::BF16:
      return "bf16";
    case wire::DType::FLOAT32:
      return "float32";
    case wire::DType::INT32:
      return "int32";
    case wire::DType::INT64:
      return "int64";
  }
  return "unknown dtype";
}

absl::Status CheckTensor(wire::Tensor::Reader tensor, wire::DType dtype,
                         std::span<const uint32_t> shape, std::string_view what) {
  std::vector<uint32_t> got;
  for (uint32_t d : tensor.getShape()) got.push_back(d);
  const std::string want_text = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (tensor.getDtype() != dtype || got != std::vector<uint32_t>(shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": expected ", std::string(DTypeName(dtype)), " ",
                     want_text, ", got ", std::string(DTypeName(tensor.getDtype())), " [",
                     absl::StrJoin(got, ", "), "]"));
  }
  uint64_t elements = 1;
  for (uint32_t d : shape) elements *= d;
  const uint64_t bytes = elements * DTypeBytes(dtype);
  if (tensor.getData().size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": ", want_text, " needs ",
                                                   bytes, " bytes, got ",
                                                   tensor.getData().size()));
  }
  return absl::OkStatus();
}

}  // namespace kvp
