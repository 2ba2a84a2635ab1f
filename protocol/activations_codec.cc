#include "protocol/activations_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/indexer_quant.h"
#include "kvpool/format/mla_latent.h"
#include "protocol/tensor_codec.h"

namespace kvp {
namespace {

using TensorList = capnp::List<wire::Tensor>;

// The tensors of one kind: one per layer, each of `shape` and `dtype`.
absl::Status CheckLayers(TensorList::Reader list, int layers, wire::DType dtype,
                         std::vector<uint32_t> shape, std::string_view what) {
  if (list.size() != 0 && layers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": ", list.size(), " tensors where this pool's kind takes none"));
  }
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
uint32_t InputDim(const PoolSpec& spec) { return static_cast<uint32_t>(spec.InputDim()); }

// Layers that carry a kind's tensors: all of them for the pool's own kind, none for the other.
int KvLayers(const PoolSpec& spec) { return spec.mla() ? 0 : spec.num_layers; }
int MlaLayers(const PoolSpec& spec) { return spec.mla() ? spec.num_layers : 0; }
int IndexLayers(const PoolSpec& spec) { return spec.indexer ? spec.num_layers : 0; }

// An MLA token's row of 576 from its latent [tokens, 512] and RoPE [tokens, 64] rows.
std::vector<Bf16> JoinLatent(const std::vector<Bf16>& latent, const std::vector<Bf16>& rope,
                             uint32_t tokens) {
  std::vector<Bf16> row(size_t{tokens} * kMlaInputDim);
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(latent.begin() + t * kMlaLatentDim, kMlaLatentDim, row.begin() + t * kMlaInputDim);
    std::copy_n(rope.begin() + t * kMlaRopeDim, kMlaRopeDim,
                row.begin() + t * kMlaInputDim + kMlaLatentDim);
  }
  return row;
}

// Columns [first, first + count) of [tokens, 576] rows.
std::vector<Bf16> LatentColumns(const std::vector<Bf16>& rows, int first, int count) {
  const size_t tokens = rows.size() / kMlaInputDim;
  std::vector<Bf16> out(tokens * count);
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(rows.begin() + t * kMlaInputDim + first, count, out.begin() + t * count);
  }
  return out;
}

}  // namespace

absl::Status CheckActivations(wire::Activations::Reader in, const PoolSpec& spec,
                              uint32_t tokens) {
  RETURN_IF_ERROR(CheckLayers(in.getK(), KvLayers(spec), wire::DType::BF16,
                              {tokens, KvHeads(spec), HeadDim(spec)}, "k"));
  RETURN_IF_ERROR(CheckLayers(in.getV(), KvLayers(spec), wire::DType::BF16,
                              {tokens, KvHeads(spec), HeadDim(spec)}, "v"));
  RETURN_IF_ERROR(CheckLayers(in.getLatent(), MlaLayers(spec), wire::DType::BF16,
                              {tokens, kMlaLatentDim}, "latent"));
  RETURN_IF_ERROR(CheckLayers(in.getRope(), MlaLayers(spec), wire::DType::BF16,
                              {tokens, kMlaRopeDim}, "rope"));
  return CheckLayers(in.getIndexK(), IndexLayers(spec), wire::DType::BF16,
                     {tokens, kIndexHeadDim}, "index k");
}

absl::Status CheckQueries(wire::Queries::Reader in, const PoolSpec& spec,
                          const ModelConfig& model) {
  const int layers = spec.num_layers;
  const int indexed = spec.indexer ? layers : 0;
  RETURN_IF_ERROR(CheckLayers(in.getQ(), layers, wire::DType::BF16,
                              {static_cast<uint32_t>(model.num_q_heads), InputDim(spec)}, "q"));
  RETURN_IF_ERROR(CheckLayers(in.getIndexQ(), indexed, wire::DType::BF16,
                              {kIndexHeads, kIndexHeadDim}, "index q"));
  return CheckLayers(in.getHeadWeights(), indexed, wire::DType::FLOAT32, {kIndexHeads},
                     "head weights");
}

absl::StatusOr<TokenActivations> ActivationsFromWire(wire::Activations::Reader in,
                                                     const PoolSpec& spec, uint32_t tokens) {
  TokenActivations a;
  ASSIGN_OR_RETURN(a.k, LayerValues<Bf16>(in.getK(), KvLayers(spec),
                                          {tokens, KvHeads(spec), HeadDim(spec)}, "k"));
  ASSIGN_OR_RETURN(a.v, LayerValues<Bf16>(in.getV(), KvLayers(spec),
                                          {tokens, KvHeads(spec), HeadDim(spec)}, "v"));
  ASSIGN_OR_RETURN(a.index_k, LayerValues<Bf16>(in.getIndexK(), IndexLayers(spec),
                                                {tokens, kIndexHeadDim}, "index k"));
  if (!spec.mla()) return a;
  ASSIGN_OR_RETURN(const auto latent, LayerValues<Bf16>(in.getLatent(), MlaLayers(spec),
                                                        {tokens, kMlaLatentDim}, "latent"));
  ASSIGN_OR_RETURN(const auto rope, LayerValues<Bf16>(in.getRope(), MlaLayers(spec),
                                                      {tokens, kMlaRopeDim}, "rope"));
  for (int l = 0; l < spec.num_layers; ++l) a.k.push_back(JoinLatent(latent[l], rope[l], tokens));
  return a;
}

absl::StatusOr<StepQueries> QueriesFromWire(wire::Queries::Reader in, const PoolSpec& spec,
                                            const ModelConfig& model) {
  const int layers = spec.num_layers;
  const int indexed = spec.indexer ? layers : 0;
  StepQueries q;
  ASSIGN_OR_RETURN(q.q, LayerValues<Bf16>(in.getQ(), layers,
                                          {static_cast<uint32_t>(model.num_q_heads), InputDim(spec)},
                                          "q"));
  ASSIGN_OR_RETURN(q.index_q, LayerValues<Bf16>(in.getIndexQ(), indexed,
                                                {kIndexHeads, kIndexHeadDim}, "index q"));
  ASSIGN_OR_RETURN(q.head_weights,
                   LayerValues<float>(in.getHeadWeights(), indexed, {kIndexHeads}, "head weights"));
  return q;
}

void ActivationsToWire(const TokenActivations& a, const PoolSpec& spec, uint32_t tokens,
                       wire::Activations::Builder out) {
  SetLayers(a.index_k, {tokens, kIndexHeadDim}, out.initIndexK(a.index_k.size()));
  if (spec.mla()) {
    auto latent = out.initLatent(a.k.size());
    auto rope = out.initRope(a.k.size());
    for (size_t l = 0; l < a.k.size(); ++l) {
      const std::vector<Bf16> x = LatentColumns(a.k[l], 0, kMlaLatentDim);
      const std::vector<Bf16> r = LatentColumns(a.k[l], kMlaLatentDim, kMlaRopeDim);
      SetTensor<Bf16>(latent[l], {tokens, kMlaLatentDim}, std::span<const Bf16>(x));
      SetTensor<Bf16>(rope[l], {tokens, kMlaRopeDim}, std::span<const Bf16>(r));
    }
    return;
  }
  SetLayers(a.k, {tokens, KvHeads(spec), HeadDim(spec)}, out.initK(a.k.size()));
  SetLayers(a.v, {tokens, KvHeads(spec), HeadDim(spec)}, out.initV(a.v.size()));
}

void QueriesToWire(const StepQueries& q, const PoolSpec& spec, const ModelConfig& model,
                   wire::Queries::Builder out) {
  SetLayers(q.q, {static_cast<uint32_t>(model.num_q_heads), InputDim(spec)},
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
  copy(in.getLatent(), out.initLatent(in.getLatent().size()));
  copy(in.getRope(), out.initRope(in.getRope().size()));
}

}  // namespace kvp
