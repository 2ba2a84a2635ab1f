#include "protocol/finite_check.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvp {
namespace {

using TensorList = capnp::List<wire::Tensor>;

// The row-major position of flat element `index` of a tensor of `shape`.
std::string PositionOf(size_t index, capnp::List<uint32_t>::Reader shape) {
  std::vector<uint64_t> at(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    at[d] = shape[d] == 0 ? 0 : index % shape[d];
    index = shape[d] == 0 ? 0 : index / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(at, ", "), "]");
}

// Index of the first NaN or Inf in `data` (bf16 or float32), or -1; sets *nan.
int64_t FirstNonFinite(capnp::Data::Reader data, wire::DType dtype, bool* nan) {
  if (dtype == wire::DType::BF16) {
    for (size_t i = 0; i + 1 < data.size(); i += 2) {
      const uint16_t v = static_cast<uint16_t>(data[i] | (data[i + 1] << 8));
      if ((v & 0x7F80u) == 0x7F80u) {
        *nan = (v & 0x007Fu) != 0;
        return static_cast<int64_t>(i / 2);
      }
    }
  } else if (dtype == wire::DType::FLOAT32) {
    for (size_t i = 0; i + 3 < data.size(); i += 4) {
      uint32_t v;
      std::memcpy(&v, data.begin() + i, 4);
      if ((v & 0x7F800000u) == 0x7F800000u) {
        *nan = (v & 0x007FFFFFu) != 0;
        return static_cast<int64_t>(i / 4);
      }
    }
  }
  return -1;
}

absl::Status CheckLayers(TensorList::Reader list, const char* what) {
  for (unsigned l = 0; l < list.size(); ++l) {
    bool nan = false;
    const int64_t at = FirstNonFinite(list[l].getData(), list[l].getDtype(), &nan);
    if (at >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of layer ", l, " at ", PositionOf(static_cast<size_t>(at), list[l].getShape()),
          " is ", nan ? "NaN" : "Inf", "; kvpool stores and attends over finite values only"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFinite(wire::Activations::Reader in) {
  if (absl::Status s = CheckLayers(in.getK(), "k"); !s.ok()) return s;
  if (absl::Status s = CheckLayers(in.getV(), "v"); !s.ok()) return s;
  return CheckLayers(in.getIndexK(), "index k");
}

absl::Status CheckFinite(wire::Queries::Reader in) {
  if (absl::Status s = CheckLayers(in.getQ(), "q"); !s.ok()) return s;
  if (absl::Status s = CheckLayers(in.getIndexQ(), "index q"); !s.ok()) return s;
  return CheckLayers(in.getHeadWeights(), "head weights");
}

}  // namespace kvp
