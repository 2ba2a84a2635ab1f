// What the two attention kernels of attention_kernel.cuh share: how the positions of a layer are
// cut into CTAs, how a CTA streams them through shared memory, how TurboNV V becomes tensor-core
// fragments, and how a CTA's warps merge into one partial result.
//
// A CTA takes (sequence, one kv head or two consecutive ones, a group of q heads, split of the
// positions). All its threads stage a chunk of positions at a time (K, V codes, V scales) into
// shared memory with cp.async, a few chunks deep: by default 64 position-heads (64 positions of
// one kv head or 32 of two), three deep; a kernel may stage more positions, less deep (the
// heads-as-columns kernel: 64 positions of two kv heads, two deep). Positions and block ids are
// loaded an iteration ahead, so a copy never waits on a dependent load of the block table or of
// the top-k indices. A cache row holds a position's heads side by side,
// so two kv heads a CTA read it in longer pieces: fewer L2 requests per byte, and fewer 32-byte
// sectors that two CTAs both read for their parts of it (V rows of 48 bytes). The L2's throughput
// is what limits the staging on an H200, so requests per byte decide its speed (bench/NOTES.md,
// dense decode).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/attention_params.h"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/log2_domain.h"
#include "kernels/common/mma.cuh"
#include "kernels/common/work_split.h"
#include "kvpool/format/turbo_codebook.h"

namespace kvp::attention {

inline constexpr int kWarps = 4;
inline constexpr int kTile = 16;               // positions one warp takes at a time
inline constexpr int kChunk = kWarps * kTile;  // position-heads a chunk, by default
inline constexpr int kStages = 3;              // chunks staged at once, by default
// Shared memory of an sm_90 SM, and what the hardware reserves of it for each resident CTA.
inline constexpr int kSmSharedBytes = 228 * 1024;
inline constexpr int kCtaReservedSharedBytes = 1024;
// A kernel's shared memory holds its pipeline and, after the last chunk, the area it merges or
// finishes its results in, over the same bytes: the larger of the two.
KVP_HD constexpr int SharedBytesOf(int pipeline_bytes, int results_bytes) {
  return pipeline_bytes > results_bytes ? pipeline_bytes : results_bytes;
}

// 2^x for softmax weights (x <= 0 in practice): one MUFU.EX2, results below 2^-126 flush to 0
// (exp2f adds a range check and two multiplies per call to keep them).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax, one row: folds a tile's maximum into the running maximum m (log2 units).
// *m_use is what the tile's scores subtract (0 while everything is -inf, so exp2 gives 0 rather
// than NaN); the result rescales what was accumulated before.
__device__ __forceinline__ float FoldTileMax(float& m, float tile_max, float* m_use) {
  const float m_new = fmaxf(m, tile_max);
  *m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float factor = Exp2Ftz(m - *m_use);
  m = m_new;
  return factor;
}

// acc[j][i] *= factor[i] for every fragment j. The running maximum settles quickly, so the warp
// skips the multiplies unless some lane's maximum moved.
template <int kFragments>
__device__ __forceinline__ void RescaleIfMaxMoved(float (&acc)[kFragments][4],
                                                  const float (&factor)[4]) {
  const bool moved =
      factor[0] != 1.0f || factor[1] != 1.0f || factor[2] != 1.0f || factor[3] != 1.0f;
  if (!__any_sync(0xFFFFFFFFu, moved)) return;
#pragma unroll
  for (int j = 0; j < kFragments; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] *= factor[i];
  }
}

// Sparse-V: whether a warp's `tiles` 16-position tiles add no V because every weight of a real
// head in them is <= τ (`needed` is false in every lane); τ = 0 never skips. Counts the skipped
// tiles when asked to.
__device__ __forceinline__ bool SkipsValues(float tau, bool needed, uint32_t* skipped_tiles,
                                            int tiles = 1) {
  if (tau <= 0.0f || __any_sync(0xFFFFFFFFu, needed)) return false;
  if (skipped_tiles != nullptr && threadIdx.x % 32 == 0)
    atomicAdd(skipped_tiles, static_cast<uint32_t>(tiles));
  return true;
}

// Where a CTA's positions come from.
struct PositionSource {
  const int32_t* indices = nullptr;  // sparse: [num_seqs, topk]; null for dense
  int32_t topk = 0;
  int32_t window = 0;  // dense only
};

// How the work is cut. A CTA covers `tiles_per_cta` head tiles of one kv head (a head tile is
// the q heads one warp's mma fragments hold); its warps split into head tiles
// (warp / warps_per_head_tile) and, within one, take every warps_per_head_tile-th 16-position tile
// of each staged chunk. A heads-as-columns CTA may instead cover `kv_heads_per_cta` kv heads of
// one head tile each.
struct Plan {
  int head_tiles = 1;        // head tiles per kv head
  int tiles_per_cta = 1;     // head tiles one CTA covers: 1, 2 or 4
  int kv_heads_per_cta = 1;  // 1 or 2 (then tiles_per_cta = 1)
  int splits = 1;            // CTAs along the positions
  int chunks = 0;            // chunks of the longest sequence
  KVP_HD int warps_per_head_tile() const { return kWarps / tiles_per_cta; }
  KVP_HD int ctas_per_kv_head() const { return (head_tiles + tiles_per_cta - 1) / tiles_per_cta; }
  // CTAs covering one split of a sequence's positions: the grid's y.
  KVP_HD int ctas_per_split(int num_kv_heads) const {
    return num_kv_heads / kv_heads_per_cta * ctas_per_kv_head();
  }
  KVP_HD int parts() const { return splits; }  // the warps of a head tile merge in the CTA
};

// One q head's (max in log2 units, sum, acc[D]) as a row of floats, in a CTA's merge area and in
// the partial results: max and sum, two floats unused, then acc from float kAccOffset, so that a
// row's acc is read and written four floats at a time.
inline constexpr int kAccOffset = 4;
KVP_HD constexpr int RowFloats(int head_dim) { return kAccOffset + head_dim; }
template <int kHeadDim>
inline constexpr int kRowFloats = RowFloats(kHeadDim);

// Partial results: [num_seqs, num_q_heads, parts] rows.
inline size_t PartialBytes(const AttentionParams& p, const Plan& plan) {
  return size_t(p.num_seqs) * p.num_q_heads * plan.parts() * RowFloats(p.cache.head_dim) *
         sizeof(float);
}

// Where byte `byte` of row first + r sits in rows of kRow bytes whose 16-byte chunks are permuted
// by row: chunk c of row i at chunk c ^ (i & kSwizzle) ^ (i odd ? kOddFlip : 0) (kSwizzle = 0: not
// permuted). `first` is a multiple of kSwizzle + 1 (the first row of a tile), so a thread's
// permutation is the same from tile to tile.
template <int kRow, int kSwizzle, int kOddFlip = 0>
KVP_HD int PermutedRowByte(int first, int r, int byte) {
  return (first + r) * kRow + (byte ^ (((r & kSwizzle) ^ ((r & 1) * kOddFlip)) << 4));
}

// Shared-memory layout of one pipeline stage of kPositions positions of kKvHeads kv heads (kChunk
// position-heads unless a kernel says otherwise): per position a K row, a V code row and a V scale
// row, each holding the heads side by side as the cache does. Rows are not padded: a copy whose
// shared-memory destination straddles two 32-byte pieces costs the L2 twice (16-byte padding of K
// rows made the L2 deliver 1.5 times K's bytes). K's 16-byte chunks are permuted instead (KByte),
// which keeps its reads free of bank conflicts. What the consumer gets: the rows, and which
// positions are real.
//
// kPairedHeads: each K head of the stage is two cache heads of kHeadDim / 2 side by side, which
// HeadsAsColumnsKernel reads a half at a time (four consecutive chunks of a row in a quarter warp
// instead of every other chunk), so rows 2m and 2m + 1 differ in chunk bit 2 as well as bit 0.
template <int kHeadDim, int kVBits, int kKvHeads, int kPositionsN = kChunk / kKvHeads,
          bool kPairedHeads = false>
struct Stage {
  static_assert(kKvHeads == 1 || kKvHeads == 2);
  static constexpr int kPositions = kPositionsN;
  static_assert(kPositions % kTile == 0);
  static constexpr int kKHead = kHeadDim;  // bytes of one head in a row
  static constexpr int kVHead = kHeadDim * kVBits / 8;
  static constexpr int kSHead = kHeadDim / 16;
  static constexpr int kKRow = kKvHeads * kKHead;
  static constexpr int kVRow = kKvHeads * kVHead;
  static constexpr int kSRow = kKvHeads * kSHead;
  // Chunk c of K row r sits at chunk c ^ (r & kKSwizzle), within its head's part of the row, so
  // the 16-byte reads of a quarter warp (rows g and g + 1, four columns) fall on different banks.
  static constexpr int kKSwizzle = (kKHead / 16 < 8 ? kKHead / 16 : 8) - 1;
  static constexpr int kKOddFlip = kPairedHeads ? 4 : 0;
  static_assert(!kPairedHeads || kKHead == 128);
  // Where byte `byte` of staged K row first + r sits; `first` is a multiple of 8.
  KVP_HD static int KByte(int first, int r, int byte) {
    return PermutedRowByte<kKRow, kKSwizzle, kKOddFlip>(first, r, byte);
  }
  static constexpr int kKBytes = kPositions * kKRow;
  static constexpr int kVBytes = kPositions * kVRow;
  static constexpr int kSBytes = kPositions * kSRow;
  static constexpr int kBytes = kKBytes + kVBytes + kSBytes;
  static_assert(kKBytes % 16 == 0 && kVBytes % 16 == 0 && kSBytes % 16 == 0);

  const uint8_t* k;      // [kPositions][kKRow], permuted as KByte says
  const uint8_t* v;      // [kPositions][kVRow]
  const uint8_t* s;      // [kPositions][kSRow]
  const int32_t* slots;  // [kPositions]: a position's slot in its block, -1 if masked
};

// The positions of the chunks being staged. Per position its slot in its block (-1 = masked), in
// a ring one longer than the stages, so the slot written for a future chunk is never one that a
// warp may still read: int32 slot[kDepth + 1][kPositions]. Then the addresses of its K, V and
// V-scale rows, bit 0 set when masked (rows are 4-byte aligned), one set a stage: the copies read
// them only when they are issued, before the stage's chunk is filled in again a barrier later:
// uintptr row[kDepth][3][kPositions]. (A ring of kDepth + 1 sets of addresses left a CTA of two kv
// heads staging turbo4 two chunks of 64 positions deep 1 KB short of a quarter of an SM.)
template <int kPositions>
inline constexpr int kSlotRowBytes = 4 * kPositions;
template <int kPositions>
inline constexpr int kAddressRowBytes = 3 * 8 * kPositions;
template <int kPositions, int kDepth>
inline constexpr int kPositionRingBytes =
    (kDepth + 1) * kSlotRowBytes<kPositions> + kDepth* kAddressRowBytes<kPositions>;

// The stages (kDepth of them), the position ring, then the f16 level pairs of the codebook.
template <int kHeadDim, int kVBits, int kKvHeads, int kPositions = kChunk / kKvHeads,
          int kDepth = kStages>
inline constexpr int kPairLevelsOffset =
    kDepth* Stage<kHeadDim, kVBits, kKvHeads, kPositions>::kBytes +
    kPositionRingBytes<kPositions, kDepth>;
// After the last chunk a CTA merges its warps' results in the same shared memory: up to 64 rows.
template <int kHeadDim>
inline constexpr int kMergeBytes = 64 * kRowFloats<kHeadDim> * 4;
template <int kHeadDim, int kVBits, int kKvHeads, int kPositions = kChunk / kKvHeads,
          int kDepth = kStages>
inline constexpr int kSharedBytes = SharedBytesOf(
    kPairLevelsOffset<kHeadDim, kVBits, kKvHeads, kPositions, kDepth> + (4 << (2 * kVBits)),
    kMergeBytes<kHeadDim>);

// `pair_levels[c0 | c1 << N]` = (level c0, level c1) as f16: fills it with the CTA's threads.
template <int kVBits>
__device__ __forceinline__ void FillPairLevels(__half2* pair_levels) {
  for (int e = threadIdx.x; e < (1 << (2 * kVBits)); e += blockDim.x) {
    pair_levels[e] = __floats2half2_rn(TurboLevel<kVBits>(e & ((1 << kVBits) - 1)),
                                       TurboLevel<kVBits>(e >> kVBits));
  }
}

// How both parts kernels begin: the codebook's pair table into shared memory (no global access,
// so while the kernel before may still run), then the wait for that kernel (the positions of
// top-k, and the workspace the combining kernel may still read). Returns the table.
template <int kHeadDim, int kVBits, int kKvHeads, int kPositions = kChunk / kKvHeads,
          int kDepth = kStages>
__device__ __forceinline__ const __half2* StartPartsKernel(uint8_t* smem) {
  __half2* pair_levels = reinterpret_cast<__half2*>(
      smem + kPairLevelsOffset<kHeadDim, kVBits, kKvHeads, kPositions, kDepth>);
  FillPairLevels<kVBits>(pair_levels);
  LetDependentsLaunch();
  WaitForPredecessor();
  return pair_levels;
}

// The byte offset of a pair-table entry whose index is the `kBits`-bit field of x at bit `at`.
template <int kBits>
__device__ __forceinline__ uint32_t FieldByteOffset(uint64_t x, int at) {
  const uint32_t moved =
      at >= 2 ? static_cast<uint32_t>(x >> (at - 2)) : static_cast<uint32_t>(x) << 2;
  return moved & (((1u << kBits) - 1u) << 2);
}

// The packed codes of TurboNV group `grp` of a staged V row, as one integer (code i in bits
// [N·i, N·i + N)). turbo3 groups are 6 bytes, so every other one starts 2 bytes into a 4-byte
// word: two aligned 4-byte reads and a funnel shift instead of three 2-byte reads.
template <int kVBits>
__device__ __forceinline__ uint64_t GroupCodes(const uint8_t* row, int grp) {
  const uint8_t* bytes = row + grp * kTurboGroupBytes<kVBits>;
  if constexpr (kVBits == 2) {
    return *reinterpret_cast<const uint32_t*>(bytes);
  } else if constexpr (kVBits == 3) {
    const int offset = grp * kTurboGroupBytes<3>;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(row + (offset & ~3));
    const uint32_t lo = words[0], hi = words[1];
    const int shift = (offset & 3) * 8;  // 0 or 16
    return uint64_t{__funnelshift_r(lo, hi, shift)} | (uint64_t{hi >> shift} << 32);
  } else {
    return *reinterpret_cast<const uint64_t*>(bytes);
  }
}

// A B fragment's worth of V: dims [g·D/8, (g+1)·D/8) of two consecutive staged positions
// (rotated domain), as f16 pairs (first position in the low half); out[i] is dim g·D/8 + i.
// D = 128: TurboNV group g; D = 256: groups 2g, 2g + 1; D = 64: half of group g / 2. Masked
// positions were staged with zero scales. The values are level · group scale: the layer's
// v_scale is left to the combining kernel (AttentionParams' outputs are linear in it).
//
// A pair costs one shift and one mask (its index), one table read and one f16x2 multiply by the
// two scales: the two positions' code streams a, b are first interleaved into the indices
// (code_a | code_b << N) of the even codes (`even`) and of the odd codes (`odd`), four bit
// operations per group instead of four per pair.
template <int kHeadDim, int kVBits>
__device__ __forceinline__ void DecodeValuePair(const uint8_t* vdata0, const uint8_t* vscale0,
                                                int v_row, int s_row, int g,
                                                const __half2* pair_levels, uint32_t* out) {
  constexpr int kDims = kHeadDim / 8;
  constexpr int kGroups = kDims >= 16 ? kDims / 16 : 1;
  constexpr int kPerGroup = kDims >= 16 ? 16 : kDims;
  // Bits [2N·j, 2N·j + N) of every 2N-bit field: where code 2j sits in a code stream.
  constexpr uint64_t kLow = [] {
    uint64_t m = 0;
    for (int j = 0; j < 8; ++j) m |= uint64_t{(1u << kVBits) - 1u} << (2 * kVBits * j);
    return m;
  }();
  const uint8_t* table = reinterpret_cast<const uint8_t*>(pair_levels);
#pragma unroll
  for (int q = 0; q < kGroups; ++q) {
    const int grp = kDims >= 16 ? g * kGroups + q : g / 2;
    const int first_elem = kDims >= 16 ? 0 : (g % 2) * kDims;
    uint64_t bits[2] = {GroupCodes<kVBits>(vdata0, grp), GroupCodes<kVBits>(vdata0 + v_row, grp)};
    // Both positions' E4M3 scale bytes side by side, converted in one instruction (exactly).
    const uint32_t two_scales = __byte_perm(vscale0[grp], vscale0[s_row + grp], 0x0040);
    const __half2_raw sr =
        __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_scales), __NV_E4M3);
    const __half2 scales = *reinterpret_cast<const __half2*>(&sr);
    if (first_elem != 0) {
      bits[0] >>= kVBits * first_elem;
      bits[1] >>= kVBits * first_elem;
    }
    const uint64_t even = (bits[0] & kLow) | ((bits[1] << kVBits) & ~kLow);
    const uint64_t odd = ((bits[0] >> kVBits) & kLow) | (bits[1] & ~kLow);
#pragma unroll
    for (int i = 0; i < kPerGroup; ++i) {
      const uint32_t offset = FieldByteOffset<2 * kVBits>(i % 2 ? odd : even, 2 * kVBits * (i / 2));
      const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(table + offset), scales);
      out[q * 16 + i] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
}

// The positions of one CTA and their trip through the pipeline. A chunk's positions, then its
// block ids, are loaded during the chunks before (kept in registers, written to the ring once they
// have arrived), so a copy never waits on a dependent load of the block table or of the top-k
// indices.
// Consecutive threads copy consecutive pieces of a row, so one warp-wide copy covers whole
// 128-byte lines (one L2 request each) rather than a sector of 16 different lines. Block sizes are
// powers of two (PoolSpec), so a slot is a mask.
template <int kHeadDim, int kVBits, bool kSparse, int kKvHeads, int kPositionsN = kChunk / kKvHeads,
          int kDepth = kStages, bool kPairedHeads = false>
class ChunkStream {
 public:
  using St = Stage<kHeadDim, kVBits, kKvHeads, kPositionsN, kPairedHeads>;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kPositions = St::kPositions;
  static constexpr int kMetaSlots = kDepth + 1;
  static_assert(kPositions <= kThreads, "one thread per position loads the chunk's positions");

  __device__ ChunkStream(const AttentionParams& p, const PositionSource& src, int splits, int split,
                         int seq, int kv_head, uint8_t* smem)
      : src_(src),
        table_(p.block_tables + int64_t{seq} * p.block_table_stride),
        base_(p.cache.base),
        block_stride_(p.cache.block_stride),
        seq_(seq),
        smem_(smem) {
    const LayerCache& c = p.cache;
    block_shift_ = __ffs(c.block_size) - 1;
    k_token_ = c.num_kv_heads * c.k_head_bytes;
    v_token_ = c.num_kv_heads * c.v_data_head_bytes;
    s_token_ = c.num_kv_heads * c.v_scale_head_bytes;
    k_src_ = static_cast<int32_t>(c.sections.k) + kv_head * c.k_head_bytes;
    v_src_ = static_cast<int32_t>(c.sections.v_data) + kv_head * c.v_data_head_bytes;
    s_src_ = static_cast<int32_t>(c.sections.v_scale) + kv_head * c.v_scale_head_bytes;
    len_ = p.seq_lens[seq];
    int32_t count;
    if constexpr (kSparse) {
      count = src.topk;
    } else {
      window_start_ = src.window > 0 && len_ > src.window ? len_ - src.window : 0;
      first_ = window_start_ & ~(kTile - 1);
      count = len_ - first_;
    }
    const int chunks = count > 0 ? (count + kPositions - 1) / kPositions : 0;
    const int per_split = (chunks + splits - 1) / splits;
    chunk_begin_ = split * per_split;
    chunk_end_ = min(chunks, chunk_begin_ + per_split);
  }

  // Calls consume(stage) with every thread for each chunk of the CTA, once it has landed (so it may
  // call __syncthreads). The stage stays valid until consume returns. Before the first chunk,
  // `copies_issued()` runs once the first chunks' copies are in flight: work that waits on other
  // loads (the queries) goes there, so that their latency overlaps the chain of positions, block
  // ids and rows rather than coming before it.
  template <class CopiesIssued, class Consume>
  __device__ __forceinline__ void ForEach(CopiesIssued&& copies_issued, Consume&& consume) {
    const bool loader = threadIdx.x < kPositions;
    if (loader) {
#pragma unroll
      for (int s = 0; s < kDepth; ++s) {
        const int32_t pos = PositionOf(chunk_begin_ + s);
        SetMeta(s, s, pos, BlockOf(pos));
      }
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kDepth - 1; ++s) {
      if (chunk_begin_ + s < chunk_end_) Issue(s);
      cp_async::Commit();
    }
    copies_issued();
    int read_stage = 0, write_stage = kDepth - 1;
    int read_meta = 0, fill_meta = kDepth;
    int32_t later_pos = loader ? PositionOf(chunk_begin_ + kDepth) : -1;
    for (int chunk = chunk_begin_; chunk < chunk_end_; ++chunk) {
      cp_async::Wait<kDepth - 2>();
      __syncthreads();  // chunk is staged, and every warp is done with the stage refilled next
      if (chunk + kDepth - 1 < chunk_end_) Issue(write_stage);
      cp_async::Commit();
      // Block ids of a later chunk (whose positions arrived during the last chunk) and the
      // positions of the one after, in flight while this one computes.
      const int32_t fill_pos = later_pos;
      int32_t fill_block = 0;
      if (loader) {
        fill_block = BlockOf(fill_pos);
        later_pos = PositionOf(chunk + kDepth + 1);
      }
      const uint8_t* st = smem_ + read_stage * St::kBytes;
      consume(St{st, st + St::kKBytes, st + St::kKBytes + St::kVBytes, MetaSlots(read_meta)});
      // The chunk staged next into this stage: its row addresses are the stage's from here on.
      if (loader) SetMeta(fill_meta, read_stage, fill_pos, fill_block);
      read_stage = Next(read_stage, kDepth);
      write_stage = Next(write_stage, kDepth);
      read_meta = Next(read_meta, kMetaSlots);
      fill_meta = Next(fill_meta, kMetaSlots);
    }
    cp_async::Wait<0>();
  }

 private:
  __device__ static int Next(int i, int n) { return i + 1 == n ? 0 : i + 1; }

  __device__ int32_t* MetaSlots(int meta) const {
    return reinterpret_cast<int32_t*>(smem_ + kDepth * St::kBytes +
                                      meta * kSlotRowBytes<kPositions>);
  }
  // Row addresses of section `section` (0 K, 1 V, 2 V scales) of the chunk staged in `stage`.
  __device__ uintptr_t* MetaRows(int stage, int section) const {
    return reinterpret_cast<uintptr_t*>(smem_ + kDepth * St::kBytes +
                                        kMetaSlots * kSlotRowBytes<kPositions> +
                                        stage * kAddressRowBytes<kPositions>) +
           section * kPositions;
  }
  // Records position threadIdx.x of a chunk (in block `block`, to be staged in `stage`) in ring
  // slot `meta`.
  __device__ void SetMeta(int meta, int stage, int32_t pos, int32_t block) const {
    const int32_t slot = pos >= 0 ? pos & ((1 << block_shift_) - 1) : -1;
    const uintptr_t masked = slot >= 0 ? 0 : 1;
    const int32_t s = slot >= 0 ? slot : 0;
    const uintptr_t start = reinterpret_cast<uintptr_t>(base_) + int64_t{block} * block_stride_;
    MetaSlots(meta)[threadIdx.x] = slot;
    MetaRows(stage, 0)[threadIdx.x] = (start + (k_src_ + s * k_token_)) | masked;
    MetaRows(stage, 1)[threadIdx.x] = (start + (v_src_ + s * v_token_)) | masked;
    MetaRows(stage, 2)[threadIdx.x] = (start + (s_src_ + s * s_token_)) | masked;
  }

  // Position threadIdx.x of chunk `chunk`, or -1.
  __device__ int32_t PositionOf(int chunk) const {
    if (chunk >= chunk_end_) return -1;
    if constexpr (kSparse) {
      const int idx = chunk * kPositions + threadIdx.x;
      const int32_t pos = idx < src_.topk ? src_.indices[int64_t{seq_} * src_.topk + idx] : -1;
      return pos >= 0 && pos < len_ ? pos : -1;
    } else {
      const int32_t pos = first_ + chunk * kPositions + threadIdx.x;
      return pos >= window_start_ && pos < len_ ? pos : -1;
    }
  }

  __device__ int32_t BlockOf(int32_t pos) const {
    return pos >= 0 ? table_[pos >> block_shift_] : 0;
  }

  // Stages the chunk whose rows were recorded for stage `stage` into it; masked positions become
  // zeros.
  __device__ void Issue(int stage) const {
    uint8_t* st = smem_ + stage * St::kBytes;
    CopyRows<16, St::kKRow, St::kKSwizzle, St::kKOddFlip>(st, MetaRows(stage, 0));
    CopyRows<PieceOf(St::kVRow), St::kVRow, 0>(st + St::kKBytes, MetaRows(stage, 1));
    CopyRows<PieceOf(St::kSRow), St::kSRow, 0>(st + St::kKBytes + St::kVBytes, MetaRows(stage, 2));
  }

  // The largest copy (16, 8 or 4 bytes) that divides a row of `bytes`.
  KVP_HD static constexpr int PieceOf(int bytes) {
    return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : 4;
  }

  // Copies each position's row of kBytes to dst rows of as many bytes, kPiece bytes per copy, the
  // pieces of each row permuted as PermutedRowByte says (16-byte pieces). Thread t copies piece
  // t % kPieces of positions t / kPieces + r · kPerPass, so all but the row address is fixed per
  // thread.
  template <int kPiece, int kBytes, int kSwizzle, int kOddFlip = 0>
  __device__ __forceinline__ void CopyRows(uint8_t* dst, const uintptr_t* rows) const {
    static_assert((kSwizzle == 0 && kOddFlip == 0) || kPiece == 16);
    constexpr int kPieces = kBytes / kPiece;
    static_assert(kBytes % kPiece == 0 && kPieces <= kThreads);
    constexpr int kPerPass = kThreads / kPieces;  // positions per pass
    const int first = threadIdx.x / kPieces;
    const int piece_offset = (threadIdx.x % kPieces) * kPiece;
    if (first >= kPerPass) return;
#pragma unroll
    for (int r = 0; r < (kPositions + kPerPass - 1) / kPerPass; ++r) {
      const int i = first + r * kPerPass;
      if (kPositions % kPerPass != 0 && i >= kPositions) break;
      const uintptr_t row = rows[i];
      const uint32_t masked = static_cast<uint32_t>(row) & 1u;
      cp_async::CopyOrZero<kPiece>(
          dst + PermutedRowByte<kBytes, kSwizzle, kOddFlip>(0, i, piece_offset),
          reinterpret_cast<const uint8_t*>(row) + (piece_offset - masked), masked == 0);
    }
  }

  const PositionSource& src_;
  const int32_t* table_;
  const uint8_t* base_;
  int64_t block_stride_;
  int seq_;
  uint8_t* smem_;
  int block_shift_;
  int32_t k_token_, v_token_, s_token_;  // bytes from one slot of a block to the next
  int32_t k_src_, v_src_, s_src_;        // offsets of this kv head's rows in slot 0 of a block
  int32_t len_ = 0, first_ = 0, window_start_ = 0;
  int chunk_begin_ = 0, chunk_end_ = 0;
};

// The dims of one q head in a kernel of kHeadDim: half of them when two cache heads run paired
// (HeadsAsColumnsKernel's kPairedHeads), whose rows and accumulators hold both heads side by side.
template <int kHeadDim, bool kPairedHeads>
inline constexpr int kQHeadDim = kPairedHeads ? kHeadDim / 2 : kHeadDim;

// Each warp has written its (max, sum, acc) rows for `kRows` heads into merge[warp][row]; the
// kWarpsPerSet warps of a set (consecutive warps covering the same heads) are merged into one
// (max, sum, acc) per head, handed four elements at a time to emit(local head, e, max, sum,
// acc[e..e+3]). Set s, row r is local q head first_local + s·kRows + r of the kv head; the first
// `heads` are real, padding comes after them. The loop runs over the real heads only, its body has
// no branch and the warps' count is a constant, so that a thread's reads of all the warps' rows
// are in flight together. (With the count a loop bound the compiler read the warps' rows one
// after another, which cost sparse decode of 128 q heads at batch 1 about a quarter of its time;
// four elements a thread come from rows whose acc is 16-byte aligned: bench/NOTES.md.)
//
// Paired heads (HeadsAsColumnsKernel's kPairedHeads): each row holds the accumulators of two cache
// heads of kHeadDim / 2 side by side, and local q head c's own are the half c / heads_per_half
// (the first heads_per_half q heads read the first cache head): only that half is merged, and
// emit gets e as an element of the q head's kHeadDim / 2.
template <int kHeadDim, int kRows, int kWarpsPerSet, bool kPairedHeads, class Emit>
__device__ __forceinline__ void MergeWarpsOf(const float* merge, int heads, int first_local,
                                             int heads_per_half, Emit&& emit) {
  constexpr int kRow = kRowFloats<kHeadDim>;
  constexpr int kThreads = kWarps * 32;  // every parts kernel's block
  constexpr int kOut = kQHeadDim<kHeadDim, kPairedHeads>;
  constexpr int kQuads = kOut / 4;
  for (int i = threadIdx.x; i < heads * kQuads; i += kThreads) {
    const int e = 4 * (i % kQuads), row = (i / kQuads) % kRows, set = i / (kQuads * kRows);
    const int local = first_local + set * kRows + row;
    const int at = kPairedHeads ? local / heads_per_half * kOut + e : e;  // in the row's acc
    const float* w0 = merge + (set * kWarpsPerSet * kRows + row) * kRow;  // the set's 1st warp
    float2 part_ms[kWarpsPerSet];
    float4 part_acc[kWarpsPerSet];
#pragma unroll
    for (int w = 0; w < kWarpsPerSet; ++w) {
      const float* part = w0 + w * kRows * kRow;
      part_ms[w] = *reinterpret_cast<const float2*>(part);
      part_acc[w] = *reinterpret_cast<const float4*>(part + kAccOffset + at);
    }
    float max_m = part_ms[0].x;
#pragma unroll
    for (int w = 1; w < kWarpsPerSet; ++w) max_m = fmaxf(max_m, part_ms[w].x);
    // Until some warp has positions everything stays 0.
    const float ref = max_m == -INFINITY ? 0.0f : max_m;
    float sum = 0.0f;
    float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < kWarpsPerSet; ++w) {
      const float scale = exp2f(part_ms[w].x - ref);
      sum += scale * part_ms[w].y;
      o.x += scale * part_acc[w].x;
      o.y += scale * part_acc[w].y;
      o.z += scale * part_acc[w].z;
      o.w += scale * part_acc[w].w;
    }
    emit(local, e, max_m, sum, o);
  }
}

// The real heads of `sets` sets of kRows from local q head first_local on (a CTA's last head tile
// may be padding).
__device__ __forceinline__ int RealHeads(int sets, int rows, int first_local, int group) {
  return min(sets * rows, group - first_local);
}

// MergeWarpsOf for sets of `warps_per_set` warps (1, 2 or 4: the CTA's warps over its head tiles)
// and the CTA's real heads among `sets` sets of kRows.
template <int kHeadDim, int kRows, bool kPairedHeads, class Emit>
__device__ __forceinline__ void MergeWarps(const float* merge, int sets, int warps_per_set,
                                           int first_local, int group, int heads_per_half,
                                           Emit&& emit) {
  static_assert(kWarps == 4, "a set is 1, 2 or 4 warps");
  const int heads = RealHeads(sets, kRows, first_local, group);
  if (warps_per_set == 4) {
    MergeWarpsOf<kHeadDim, kRows, 4, kPairedHeads>(merge, heads, first_local, heads_per_half, emit);
  } else if (warps_per_set == 2) {
    MergeWarpsOf<kHeadDim, kRows, 2, kPairedHeads>(merge, heads, first_local, heads_per_half, emit);
  } else {
    MergeWarpsOf<kHeadDim, kRows, 1, kPairedHeads>(merge, heads, first_local, heads_per_half, emit);
  }
}

// One part per q head of the merged warps: parts[q head][split] = (max, sum, acc[D]), D the q
// head's dims (kHeadDim / 2 for paired heads, MergeWarpsOf).
template <int kHeadDim, int kRows, bool kPairedHeads = false>
__device__ void WriteParts(const float* merge, int sets, int warps_per_set, int first_local,
                           int group, float* parts, int64_t first_q_head, int parts_n, int split,
                           int heads_per_half = 1) {
  constexpr int kOut = kQHeadDim<kHeadDim, kPairedHeads>;
  MergeWarps<kHeadDim, kRows, kPairedHeads>(
      merge, sets, warps_per_set, first_local, group, heads_per_half,
      [&](int local, int e, float max_m, float sum, float4 o) {
        float* out = parts + ((first_q_head + local) * parts_n + split) * kRowFloats<kOut>;
        if (e == 0) *reinterpret_cast<float2*>(out) = make_float2(max_m, sum);
        *reinterpret_cast<float4*>(out + kAccOffset + e) = o;
      });
}

// The output of a q head from its merged sum and accumulator element (rotated domain): the
// layer's v_scale applies here, once (DecodeValuePair leaves it out).
__device__ __forceinline__ float Normalized(float o, float sum, const AttentionParams& p) {
  return sum > 0.0f ? o / sum * p.cache.v_codec.scale : 0.0f;
}

// Lane l of a warp holds elements [l·kPer, l·kPer + kPer) of one q head's normalized output, in
// the rotated domain. Applies the inverse Walsh-Hadamard rotation when the layer has one, in
// registers (stages below kPer within the lane, the others across lanes with shuffles; the lane
// holding element e + h of a butterfly keeps the difference), and writes q head `head` of p.out.
template <int kHeadDim>
__device__ __forceinline__ void RotateBackAndWriteHead(float (&x)[kHeadDim / 32],
                                                       const AttentionParams& p, int64_t head) {
  constexpr int kPer = kHeadDim / 32;  // 2, 4 or 8
  const int lane = threadIdx.x % 32;
  const LayerCache& c = p.cache;
  if (TraitsOf(c.v_codec.format).turbo && c.v_codec.rotate) {
#pragma unroll
    for (int h = 1; h < kPer; h *= 2) {
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if ((j & h) == 0) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
      }
    }
#pragma unroll
    for (int lanes = 1; lanes < 32; lanes *= 2) {
      const bool upper = (lane & lanes) != 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, x[j], lanes);
        x[j] = upper ? other - x[j] : x[j] + other;
      }
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      x[j] *= InvSqrtHeadDim(kHeadDim);
      if (c.v_codec.signs.Negative(lane * kPer + j)) x[j] = -x[j];
    }
  }
  float* out = p.out + head * kHeadDim + lane * kPer;
#pragma unroll
  for (int j = 0; j < kPer; ++j) out[j] = x[j];
}

// x holds `heads` normalized outputs of D floats each (rotated domain) in shared memory, and
// every thread of the block has passed a __syncthreads since they were written. Warp w rotates
// back and writes q heads first_q_head + w, + w + (warps), ... of p.out.
template <int kHeadDim>
__device__ void RotateBackAndWrite(const float* x, int heads, const AttentionParams& p,
                                   int64_t first_q_head) {
  constexpr int kPer = kHeadDim / 32;
  const int lane = threadIdx.x % 32;
  for (int h = threadIdx.x / 32; h < heads; h += blockDim.x / 32) {
    float v[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) v[j] = x[h * kHeadDim + lane * kPer + j];
    RotateBackAndWriteHead<kHeadDim>(v, p, first_q_head + h);
  }
}

// The outputs of the merged warps, for a CTA that is its heads' only part (WriteParts' sets,
// warps and heads): each head's (max, sum, acc) normalized into x ([head - first_local][D], in
// shared memory past the merge rows), then rotated back and written to p.out. Q heads
// first_q_head + first_local, ...: the CTA's heads that exist.
template <int kHeadDim, int kRows, bool kPairedHeads = false>
__device__ void WriteOutputs(const float* merge, int sets, int warps_per_set, int first_local,
                             int group, float* x, const AttentionParams& p, int64_t first_q_head,
                             int heads_per_half = 1) {
  constexpr int kOut = kQHeadDim<kHeadDim, kPairedHeads>;
  MergeWarps<kHeadDim, kRows, kPairedHeads>(
      merge, sets, warps_per_set, first_local, group, heads_per_half,
      [&](int local, int e, float, float sum, float4 o) {
        const float4 y = {Normalized(o.x, sum, p), Normalized(o.y, sum, p), Normalized(o.z, sum, p),
                          Normalized(o.w, sum, p)};
        *reinterpret_cast<float4*>(x + (local - first_local) * kOut + e) = y;
      });
  __syncthreads();
  const int heads = RealHeads(sets, kRows, first_local, group);
  RotateBackAndWrite<kOut>(x, heads, p, first_q_head + first_local);
}

}  // namespace kvp::attention
