#include "protocol/content_digest.h"

#include <sodium.h>

#include <cstring>

namespace kvp {
namespace {

// Every tensor's bytes, read once: each read of a Data field counts its whole size against the
// message's traversal limit, so reading them per token would refuse long prompts.
void AddTensors(capnp::List<wire::Tensor>::Reader list, std::vector<capnp::Data::Reader>& out) {
  for (auto tensor : list) out.push_back(tensor.getData());
}

}  // namespace

ContentDigester::ContentDigester() {
  // sodium_init is idempotent and thread-safe (1: already done); should it fail, randombytes_buf
  // aborts rather than hand out a predictable key.
  if (sodium_init() < 0) randombytes_stir();
  randombytes_buf(key_.data(), key_.size());
}

std::vector<TokenDigest> ContentDigester::TokenDigests(wire::Activations::Reader in, uint32_t first,
                                                       uint32_t count) const {
  const auto k = in.getK();
  const uint32_t total = k.size() > 0 && k[0].getShape().size() > 0 ? k[0].getShape()[0] : 0;
  std::vector<capnp::Data::Reader> tensors;
  AddTensors(k, tensors);
  AddTensors(in.getV(), tensors);
  AddTensors(in.getIndexK(), tensors);
  std::vector<TokenDigest> digests(count);
  for (uint32_t i = 0; i < count; ++i) {
    crypto_generichash_state state;
    crypto_generichash_init(&state, key_.data(), key_.size(), sizeof(TokenDigest));
    for (const capnp::Data::Reader& data : tensors) {
      const size_t row = total == 0 ? 0 : data.size() / total;
      crypto_generichash_update(&state, data.begin() + row * (first + i), row);
    }
    unsigned char out[sizeof(TokenDigest)];
    crypto_generichash_final(&state, out, sizeof(out));
    std::memcpy(&digests[i].lo, out, 8);
    std::memcpy(&digests[i].hi, out + 8, 8);
    // The two constants stand for synthetic and engine-written tokens: never a client's.
    if (digests[i] == kSyntheticTokenDigest || digests[i] == kEngineTokenDigest) digests[i].lo ^= 1;
  }
  return digests;
}

uint64_t ContentDigester::NamespaceRoot(absl::string_view name) const {
  if (name.empty()) return kRootPrefixHash;
  uint64_t root = 0;
  crypto_generichash(reinterpret_cast<unsigned char*>(&root), sizeof(root),
                     reinterpret_cast<const unsigned char*>(name.data()), name.size(), key_.data(),
                     key_.size());
  return root == kRootPrefixHash ? root ^ 1 : root;
}

}  // namespace kvp
