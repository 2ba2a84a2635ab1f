// PoolSpec: the shape and formats of one pool (docs/design.md §4). Everything that decides bytes in
// a block is here; BlockLayout turns it into offsets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

inline constexpr int kDefaultBlockSize = 64;  // the indexer kernels' natural block

// What a pool caches per token and layer (docs/design.md §4):
//   kKv:  FP8/bf16 K and TurboNV/bf16 V per kv head, optionally the indexer's keys;
//   kMla: one fp8_ds_mla latent (kvpool/format/mla_latent.h) shared by all query heads, and the
//         indexer's keys (sparse MLA decode attends to what the indexer's top-k selects).
// The numbers match the wire enum PoolKind.
enum class PoolKind : uint8_t { kKv = 0, kMla = 1 };
inline constexpr int kNumPoolKinds = 2;

struct PoolSpec {
  PoolKind kind = PoolKind::kKv;
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

  bool mla() const { return kind == PoolKind::kMla; }
  // Values of one head of a token's K (and V) input and of a query head: head_dim, or an MLA
  // pool's 576 (the latent, then the RoPE part; absorbed queries have the same shape). Decode
  // outputs head_dim values a query head either way.
  int InputDim() const;

  float KScale(int layer) const { return k_scales.empty() ? 1.0f : k_scales[layer]; }
  float VScale(int layer) const { return v_scales.empty() ? 1.0f : v_scales[layer]; }

  // One line for logs: "layers=4 kv_heads=8 head_dim=128 block=64 k=fp8_e4m3 v=turbo3 ...".
  std::string DebugString() const;

  friend bool operator==(const PoolSpec&, const PoolSpec&) = default;
};

// An MLA pool of `num_layers` layers: one latent "head" of 512 values (what decode outputs), the
// indexer's sections, the K/V fields at their defaults (they describe no bytes of this kind).
PoolSpec MlaPoolSpec(int num_layers, int block_size, bool indexer_ue8m0);

// INVALID_ARGUMENT naming the first field out of range; UNIMPLEMENTED for a format in a role it
// cannot fill (for example turbo3 as the K format). An MLA pool must be MlaPoolSpec's shape.
absl::Status ValidatePoolSpec(const PoolSpec& spec);

// "kv" or "mla"; ParsePoolKind reads them back (INVALID_ARGUMENT otherwise).
const char* PoolKindName(PoolKind kind);
absl::StatusOr<PoolKind> ParsePoolKind(std::string_view name);

}  // namespace kvp
