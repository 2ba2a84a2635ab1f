// Content digests of client tensors (kvpool/pool/prefix_hash.h): what lets a prefix hit require the
// same K/V bytes and not just the same token ids, and keeps cache namespaces apart.
//
// Digests are keyed BLAKE2b (libsodium) under a secret drawn at start and never sent, so no
// client can make its tensors or namespace name collide with another's. Thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "kvpool/pool/prefix_hash.h"
#include "protocol/kvpool.capnp.h"

namespace kvp {

class ContentDigester {
 public:
  using Key = std::array<unsigned char, 32>;
  // A fresh random key.
  ContentDigester();
  // A key kept from an earlier start (kvpoold's state log): recovered blocks stay findable.
  explicit ContentDigester(const Key& key) : key_(key) {}
  const Key& key() const { return key_; }

  // One digest per token of rows [first, first + count) of `in`: the token's K, V and index K
  // rows of every layer. REQUIRES: `in` passed CheckActivations for first + count tokens or more.
  std::vector<TokenDigest> TokenDigests(wire::Activations::Reader in, uint32_t first,
                                        uint32_t count) const;

  // The chain root of namespace `name`; the default namespace ("") is kRootPrefixHash.
  uint64_t NamespaceRoot(absl::string_view name) const;

 private:
  Key key_;
};

}  // namespace kvp
