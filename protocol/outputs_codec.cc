#include "protocol/outputs_codec.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "protocol/tensor_codec.h"

namespace kvp {
namespace {

// A 1- or 2-dimensional tensor of T whose shape is whatever it says, checked for consistency.
template <typename T>
absl::StatusOr<std::vector<T>> AnyShapeValues(wire::Tensor::Reader t, const std::string& what) {
  std::vector<uint32_t> shape;
  for (uint32_t d : t.getShape()) shape.push_back(d);
  RETURN_IF_ERROR(CheckTensor(t, WireDType<T>::kValue, shape, what));
  std::vector<T> values(t.getData().size() / sizeof(T));
  std::memcpy(values.data(), t.getData().begin(), t.getData().size());
  return values;
}

}  // namespace

void DecodeResultsToWire(const std::vector<DecodeStepResult>& results, uint32_t num_q_heads,
                         uint32_t head_dim, capnp::List<wire::DecodeOutput>::Builder out) {
  for (size_t i = 0; i < results.size(); ++i) {
    const DecodeStepResult& r = results[i];
    auto o = out[i];
    o.setSequence(r.sequence);
    o.setLength(static_cast<uint64_t>(r.length));
    auto outs = o.initOut(r.out.size());
    for (size_t l = 0; l < r.out.size(); ++l) {
      SetTensor<float>(outs[l], {num_q_heads, head_dim}, std::span<const float>(r.out[l]));
    }
    auto lse = o.initLse(r.lse.size());
    for (size_t l = 0; l < r.lse.size(); ++l) {
      SetTensor<float>(lse[l], {num_q_heads}, std::span<const float>(r.lse[l]));
    }
    auto topk = o.initTopk(r.topk.size());
    for (size_t l = 0; l < r.topk.size(); ++l) {
      SetTensor<int32_t>(topk[l], {static_cast<uint32_t>(r.topk[l].size())},
                         std::span<const int32_t>(r.topk[l]));
    }
  }
}

absl::StatusOr<std::vector<DecodeStepResult>> DecodeResultsFromWire(
    capnp::List<wire::DecodeOutput>::Reader in) {
  std::vector<DecodeStepResult> results;
  for (auto o : in) {
    DecodeStepResult r;
    r.sequence = o.getSequence();
    r.length = static_cast<int64_t>(o.getLength());
    for (unsigned l = 0; l < o.getOut().size(); ++l) {
      ASSIGN_OR_RETURN(auto v, AnyShapeValues<float>(o.getOut()[l], absl::StrCat("out ", l)));
      r.out.push_back(std::move(v));
    }
    for (unsigned l = 0; l < o.getTopk().size(); ++l) {
      ASSIGN_OR_RETURN(auto v, AnyShapeValues<int32_t>(o.getTopk()[l], absl::StrCat("topk ", l)));
      r.topk.push_back(std::move(v));
    }
    for (unsigned l = 0; l < o.getLse().size(); ++l) {
      ASSIGN_OR_RETURN(auto v, AnyShapeValues<float>(o.getLse()[l], absl::StrCat("lse ", l)));
      r.lse.push_back(std::move(v));
    }
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace kvp
