// The prefix hash chain: a full block's key is (parent block's hash, the block's token ids, the
// digest of what its K/V were made from), so equal hashes mean equal prefixes up to and including
// the block (modulo 64-bit collisions, which the prefix index rules out by comparing the block's
// namespace root, token ids and content digest).
//
// Content, not token ids alone, decides a prefix hit (docs/design.md §6): two clients that prefill
// the same ids with their own tensors must not read each other's K/V. Each token has a TokenDigest:
// the synthetic model's tokens a constant (their K/V follow from the id), client tensors a keyed
// digest of their bytes (protocol/content_digest.h), engine-written tokens another constant (shared
// only inside a named namespace, whose clients vouch for them). A namespace is a chain root: blocks
// under different roots are never shared.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace kvp {

inline constexpr uint64_t kRootPrefixHash = 0x6B76706F6F6C5248ull;  // the default namespace

struct TokenDigest {
  uint64_t lo = 0, hi = 0;
  friend bool operator==(const TokenDigest&, const TokenDigest&) = default;
};
inline constexpr TokenDigest kSyntheticTokenDigest{};
inline constexpr TokenDigest kEngineTokenDigest{~uint64_t{0}, ~uint64_t{0}};

// One digest for a block's tokens, in order; all-synthetic tokens give kSyntheticTokenDigest.
TokenDigest BlockDigest(absl::Span<const TokenDigest> tokens);

uint64_t ChainPrefixHash(uint64_t parent, absl::Span<const int32_t> tokens,
                         const TokenDigest& content);

}  // namespace kvp
