#include "kvpool/arena/arena_description.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/layout/block_layout.h"

namespace kvp {
namespace {

constexpr uint32_t kMagic = 0x4B56504Cu;  // "KVPL"
constexpr uint32_t kVersion = 3;  // 2: arena_id after the epoch; 3: the pool kind at the end

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));  // little-endian hosts only
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ > in_.size() || in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  absl::Span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t ArenaDescription::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : chunk_bytes) total += b;
  return total;
}

std::string EncodeArenaDescription(const ArenaDescription& d) {
  Writer w;
  w.Put(kMagic);
  w.Put(kVersion);
  w.Put(static_cast<uint8_t>(d.kind));
  w.Put(d.epoch);
  w.Put(d.arena_id);
  w.Put(d.device);
  w.Put(static_cast<uint32_t>(d.chunk_bytes.size()));
  for (uint64_t b : d.chunk_bytes) w.Put(b);
  w.Put(d.num_blocks);
  const PoolSpec& s = d.spec;
  w.Put(static_cast<int32_t>(s.num_layers));
  w.Put(static_cast<int32_t>(s.num_kv_heads));
  w.Put(static_cast<int32_t>(s.head_dim));
  w.Put(static_cast<int32_t>(s.block_size));
  w.Put(static_cast<uint8_t>(s.k_format));
  w.Put(static_cast<uint8_t>(s.v_format));
  w.Put(static_cast<uint8_t>(s.v_rotation));
  w.Put(static_cast<uint8_t>(s.indexer));
  w.Put(static_cast<uint8_t>(s.indexer_ue8m0));
  w.Put(static_cast<uint32_t>(s.k_scales.size()));
  for (float f : s.k_scales) w.Put(f);
  w.Put(static_cast<uint32_t>(s.v_scales.size()));
  for (float f : s.v_scales) w.Put(f);
  w.Put(static_cast<uint8_t>(s.kind));
  return w.Take();
}

absl::StatusOr<ArenaDescription> DecodeArenaDescription(absl::Span<const uint8_t> bytes) {
  Reader r(bytes);
  auto truncated = [] { return absl::InvalidArgumentError("arena description is truncated"); };
  uint32_t magic, version, chunks;
  uint8_t kind;
  ArenaDescription d;
  if (!r.Get(&magic) || !r.Get(&version)) return truncated();
  if (magic != kMagic || version < 1 || version > kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("arena description has magic ", magic,
                                                   " version ", version,
                                                   "; this build reads versions 1 to ", kVersion));
  }
  if (!r.Get(&kind) || !r.Get(&d.epoch) || (version >= 2 && !r.Get(&d.arena_id)) ||
      !r.Get(&d.device) || !r.Get(&chunks)) {
    return truncated();
  }
  if (kind != static_cast<uint8_t>(ArenaKind::kHost) &&
      kind != static_cast<uint8_t>(ArenaKind::kCuda)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown arena kind ", kind));
  }
  d.kind = static_cast<ArenaKind>(kind);
  if (chunks > kMaxArenaChunks) {
    return absl::InvalidArgumentError(absl::StrCat("arena description names ", chunks, " chunks"));
  }
  d.chunk_bytes.resize(chunks);
  uint64_t total = 0;
  for (uint64_t& b : d.chunk_bytes) {
    if (!r.Get(&b)) return truncated();
    if (b > UINT64_MAX - total) {
      return absl::InvalidArgumentError("arena description's chunk sizes overflow");
    }
    total += b;
  }
  int32_t i32[4];
  uint8_t u8[5];
  uint32_t n_k, n_v;
  if (!r.Get(&d.num_blocks)) return truncated();
  for (int32_t& v : i32) {
    if (!r.Get(&v)) return truncated();
  }
  for (uint8_t& v : u8) {
    if (!r.Get(&v)) return truncated();
  }
  PoolSpec& s = d.spec;
  s.num_layers = i32[0];
  s.num_kv_heads = i32[1];
  s.head_dim = i32[2];
  s.block_size = i32[3];
  if (u8[0] >= kNumKvFormats || u8[1] >= kNumKvFormats) {
    return absl::InvalidArgumentError("arena description names an unknown format");
  }
  s.k_format = static_cast<KvFormat>(u8[0]);
  s.v_format = static_cast<KvFormat>(u8[1]);
  s.v_rotation = u8[2] != 0;
  s.indexer = u8[3] != 0;
  s.indexer_ue8m0 = u8[4] != 0;
  if (!r.Get(&n_k) || n_k > 1024) return truncated();
  s.k_scales.resize(n_k);
  for (float& f : s.k_scales) {
    if (!r.Get(&f)) return truncated();
  }
  if (!r.Get(&n_v) || n_v > 1024) return truncated();
  s.v_scales.resize(n_v);
  for (float& f : s.v_scales) {
    if (!r.Get(&f)) return truncated();
  }
  if (version >= 3) {
    uint8_t pool_kind;
    if (!r.Get(&pool_kind)) return truncated();
    if (pool_kind >= kNumPoolKinds) {
      return absl::InvalidArgumentError(absl::StrCat("unknown pool kind ", pool_kind));
    }
    s.kind = static_cast<PoolKind>(pool_kind);
  }
  if (!r.done()) return absl::InvalidArgumentError("arena description has trailing bytes");
  RETURN_IF_ERROR(ValidatePoolSpec(s));
  // Every block an attaching process may touch must lie inside the chunks it maps.
  ASSIGN_OR_RETURN(const BlockLayout layout, BlockLayout::Create(s));
  const uint64_t stride = static_cast<uint64_t>(layout.block_stride());
  if (d.num_blocks <= 0 || static_cast<uint64_t>(d.num_blocks) > d.total_bytes() / stride) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena description has ", d.num_blocks, " blocks of ", stride,
                     " bytes in ", d.total_bytes(), " bytes of chunks"));
  }
  return d;
}

}  // namespace kvp
