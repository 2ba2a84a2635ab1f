#include "protocol/activations_codec.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/indexer_quant.h"
#include "protocol/tensor_codec.h"

namespace kvp {
namespace {

using TensorList = capnp::List<wire::Tensor>;

// The tensors of one kind: one per layer, each of `shape` and `dtype`.
absl::Status CheckLayers(TensorList::Reader list, int layers, wire::DType dtype,
                         std::vector<uint32_t> shape, std::string_view what) {
  if (list.size() != static_cast<unsigned>(layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": ", list.size(), " tensors for ", layers, " layers"));
  }
  for (int l = 0; l < layers; ++l) {
    RETURN_IF_ERROR(
        CheckTensor(list[l], dtype, shape, absl::StrCat("layer ", l, " ", std::string(what))));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<std::vector<T>>> LayerValues(TensorList::Reader list, int layers,
                                                        std::vector<uint32_t> shape,
                                                        std::string_view what) {
  RETURN_IF_ERROR(CheckLayers(list, layers, WireDType<T>::kValue, shape, what));
  std::vector<std::vector<T>> out(layers);
  for (int l = 0; l < layers; ++l) {
    const auto data = list[l].getData();
    out[l].resize(data.size() / sizeof(T));
    std::memcpy(out[l].data(), data.begin(), data.size());
  }
  return out;
}

template <typename T>
void SetLayers(const std::vector<std::vector<T>>& values, std::initializer_list<uint32_t> shape,
               TensorList::Builder out) {
  for (size_t l = 0; l < values.size(); ++l) {
    SetTensor<T>(out[l], shape, std::span<const T>(values[l]));
  }
}

uint32_t KvHeads(const PoolSpec& spec) { return static_cast<uint32_t>(spec.num_kv_heads); }
uint32_t HeadDim(const PoolSpec& spec) { return static_cast<uint32_t>(spec.head_dim); }

}  // namespace

absl::Status CheckActivations(wire::Activations::Reader in, const PoolSpec& spec,
                              uint32_t tokens) {
  const int layers = spec.num_layers;
  RETURN_IF_ERROR(CheckLayers(in.getK(), layers, wire::DType::BF16,
                              {tokens, KvHeads(spec), HeadDim(spec)}, "k"));
  RETURN_IF_ERROR(CheckLayers(in.getV(), layers, wire::DType::BF16,
                              {tokens, KvHeads(spec), HeadDim(spec)}, "v"));
  return CheckLayers(in.getIndexK(), spec.indexer ? layers : 0, wire::DType::BF16,
                     {tokens, kIndexHeadDim}, "index k");
}

absl::Status CheckQueries(wire::Queries::Reader in, const PoolSpec& spec,
                          const ModelConfig& model) {
  const int layers = spec.num_layers;
  const int indexed = spec.indexer ? layers : 0;
  RETURN_IF_ERROR(CheckLayers(in.getQ(), layers, wire::DType::BF16,
                              {static_cast<uint32_t>(model.num_q_heads), HeadDim(spec)}, "q"));
  RETURN_IF_ERROR(CheckLayers(in.getIndexQ(), indexed, wire::DType::BF16,
                              {kIndexHeads, kIndexHeadDim}, "index q"));
  return CheckLayers(in.getHeadWeights(), indexed, wire::DType::FLOAT32, {kIndexHeads},
                     "head weights");
}

absl::StatusOr<TokenActivations> ActivationsFromWire(wire::Activations::Reader in,
                                                     const PoolSpec& spec, uint32_t tokens) {
  const int layers = spec.num_layers;
  TokenActivations a;
  ASSIGN_OR_RETURN(a.k,
                   LayerValues<Bf16>(in.getK(), layers, {tokens, KvHeads(spec), HeadDim(spec)}, "k"));
  ASSIGN_OR_RETURN(a.v,
                   LayerValues<Bf16>(in.getV(), layers, {tokens, KvHeads(spec), HeadDim(spec)}, "v"));
  ASSIGN_OR_RETURN(a.index_k, LayerValues<Bf16>(in.getIndexK(), spec.indexer ? layers : 0,
                                                {tokens, kIndexHeadDim}, "index k"));
  return a;
}

absl::StatusOr<StepQueries> QueriesFromWire(wire::Queries::Reader in, const PoolSpec& spec,
                                            const ModelConfig& model) {
  const int layers = spec.num_layers;
  const int indexed = spec.indexer ? layers : 0;
  StepQueries q;
  ASSIGN_OR_RETURN(q.q, LayerValues<Bf16>(in.getQ(), layers,
                                          {static_cast<uint32_t>(model.num_q_heads), HeadDim(spec)},
                                          "q"));
  ASSIGN_OR_RETURN(q.index_q, LayerValues<Bf16>(in.getIndexQ(), indexed,
                                                {kIndexHeads, kIndexHeadDim}, "index q"));
  ASSIGN_OR_RETURN(q.head_weights,
                   LayerValues<float>(in.getHeadWeights(), indexed, {kIndexHeads}, "head weights"));
  return q;
}

void ActivationsToWire(const TokenActivations& a, const PoolSpec& spec, uint32_t tokens,
                       wire::Activations::Builder out) {
  SetLayers(a.k, {tokens, KvHeads(spec), HeadDim(spec)}, out.initK(a.k.size()));
  SetLayers(a.v, {tokens, KvHeads(spec), HeadDim(spec)}, out.initV(a.v.size()));
  SetLayers(a.index_k, {tokens, kIndexHeadDim}, out.initIndexK(a.index_k.size()));
}

void QueriesToWire(const StepQueries& q, const PoolSpec& spec, const ModelConfig& model,
                   wire::Queries::Builder out) {
  SetLayers(q.q, {static_cast<uint32_t>(model.num_q_heads), HeadDim(spec)},
            out.initQ(q.q.size()));
  SetLayers(q.index_q, {kIndexHeads, kIndexHeadDim}, out.initIndexQ(q.index_q.size()));
  SetLayers(q.head_weights, {kIndexHeads}, out.initHeadWeights(q.head_weights.size()));
}

void CopyActivationRows(wire::Activations::Reader in, uint32_t first, uint32_t count,
                        wire::Activations::Builder out) {
  auto copy = [&](TensorList::Reader from, TensorList::Builder to) {
    for (unsigned l = 0; l < from.size(); ++l) {
      const auto shape = from[l].getShape();
      const auto data = from[l].getData();
      const size_t row_bytes = data.size() / shape[0];
      to[l].setDtype(from[l].getDtype());
      auto dims = to[l].initShape(shape.size());
      dims.set(0, count);
      for (unsigned i = 1; i < shape.size(); ++i) dims.set(i, shape[i]);
      auto bytes = to[l].initData(count * row_bytes);
      std::memcpy(bytes.begin(), data.begin() + first * row_bytes, count * row_bytes);
    }
  };
  copy(in.getK(), out.initK(in.getK().size()));
  copy(in.getV(), out.initV(in.getV().size()));
  copy(in.getIndexK(), out.initIndexK(in.getIndexK().size()));
}

}  // namespace kvp
