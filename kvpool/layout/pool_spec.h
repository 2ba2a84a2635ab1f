// PoolSpec: the shape and formats of one pool (docs/design.md §4). Everything that decides bytes in
// a block is here; BlockLayout turns it into offsets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

inline constexpr int kDefaultBlockSize = 64;  // the indexer kernels' natural block

struct PoolSpec {
  int num_layers = 1;
  int num_kv_heads = 8;
  int head_dim = 128;                      // 64, 128 or 256
  int block_size = kDefaultBlockSize;      // tokens per block: 16, 32 or 64
  KvFormat k_format = KvFormat::kFp8E4m3;  // bf16 or fp8_e4m3
  KvFormat v_format = KvFormat::kTurbo3;   // bf16 or turbo2/3/4
  bool v_rotation = true;                  // TurboNV signed Walsh-Hadamard rotation
  bool indexer = false;                    // DeepSeek-V3.2 lightning-indexer sections
  bool indexer_ue8m0 = true;               // power-of-two indexer scales
  std::vector<float> k_scales;             // per layer; empty = 1.0 everywhere
  std::vector<float> v_scales;             // per layer; empty = 1.0 everywhere

  float KScale(int layer) const { return k_scales.empty() ? 1.0f : k_scales[layer]; }
  float VScale(int layer) const { return v_scales.empty() ? 1.0f : v_scales[layer]; }

  // One line for logs: "layers=4 kv_heads=8 head_dim=128 block=64 k=fp8_e4m3 v=turbo3 ...".
  std::string DebugString() const;

  friend bool operator==(const PoolSpec&, const PoolSpec&) = default;
};

// INVALID_ARGUMENT naming the first field out of range; UNIMPLEMENTED for a format in a role it
// cannot fill (for example turbo3 as the K format).
absl::Status ValidatePoolSpec(const PoolSpec& spec);

}  // namespace kvp
