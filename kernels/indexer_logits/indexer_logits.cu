// Indexer logits with warpgroup tensor cores, streamed: a CTA (one warpgroup) walks a range of
// 64-position chunks of one sequence. Warp 0 keeps kStages - 1 chunks in flight, each as one bulk
// copy of every cache block's keys and one of its scales (a chunk is 64 / block_size whole blocks),
// counted on the stage's barrier; the table entries come 32 at a time, a window ahead.
//
// Per chunk, Sᵀ = K·Qᵀ is eight FP8 wgmma m64n64k32: the 64 positions are the rows of A, the key
// bytes as the cache holds them, straight from shared memory into registers (thread t takes 32
// contiguous key bytes of a row, as in attention), and the 64 heads' queries are B, split once per
// CTA into two E4M3 parts whose sum is exact (e4m3_split.h): four wgmma for the low part, then
// four for the high. ReLU and the head weights, each carrying its head's 2^-e, apply to the
// accumulators; the heads of a row sit in one quad, so two shuffles sum them, and the position's
// scale (positive, so it commutes with ReLU) finishes the logit.
#include <cstdint>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/e4m3_split.h"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/work_split.h"
#include "kernels/indexer_logits/indexer_logits_launch.h"

namespace kvp {
namespace {

constexpr int kThreads = 128;               // one warpgroup
constexpr int kChunk = 64;                  // positions per pipeline step: the M of one wgmma
constexpr int kStages = 4;                  // chunks in flight or being computed
constexpr int kSteps = kIndexHeadDim / 32;  // k-steps of K·Qᵀ: 32 E4M3 bytes each
constexpr int kWords = kIndexHeadDim / 16;  // 4-byte words a thread takes of a key or query row
static_assert(kIndexHeadDim == wgmma::kSwizzleRowBytes, "a query row is one swizzled row");
static_assert(kIndexHeads == 64, "the heads are the N of one m64n64 wgmma");

struct Shared {
  // B: the queries' high and low E4M3 parts, head rows, k in the A fragments' order (StageQueries).
  uint8_t queries[2][kIndexHeads * wgmma::kSwizzleRowBytes];
  uint8_t keys[kStages][kChunk * kIndexHeadDim];  // the chunk's key rows, as in the cache
  float scales[kStages][kChunk];
  float unscale[kIndexHeads];  // 2^-e of each head's split (e4m3_split.h)
  uint64_t staged[kStages];    // completes when the stage's bytes have landed
};
// The wgmma operands need 1024-byte alignment; the launch adds that much slack to find it.
constexpr int kSharedBytes = sizeof(Shared) + wgmma::kSwizzleAtomBytes;

// Warp 0's view of a sequence's block table: lane l holds entry window + l, and window + 32 + l
// for when the chunks move on, so no chunk waits for a table read.
class BlockFeed {
 public:
  __device__ BlockFeed(const int32_t* table, int32_t blocks, int first)
      : table_(table), blocks_(blocks), window_(first) {
    current_ = Entry(window_ + Lane());
    next_ = Entry(window_ + 32 + Lane());
  }
  // Entry `index` + lane % per_chunk for every lane (per_chunk a power of two); `index` only grows,
  // by at most 32 a call.
  __device__ int32_t Blocks(int index, int per_chunk) {
    if (index >= window_ + 32) {
      window_ += 32;
      current_ = next_;
      next_ = Entry(window_ + 32 + Lane());
    }
    return __shfl_sync(0xFFFFFFFFu, current_, index - window_ + (Lane() & (per_chunk - 1)));
  }

 private:
  __device__ static int Lane() { return static_cast<int>(threadIdx.x % 32); }
  __device__ int32_t Entry(int index) const { return index < blocks_ ? table_[index] : 0; }

  const int32_t* table_;
  int32_t blocks_;  // entries that may be read
  int window_;
  int32_t current_, next_;
};

// Splits sequence `seq`'s queries into E4M3 B rows in shared memory, k in the order the A
// fragments give the key dims: thread t of a quad holds bytes [32t, 32t + 32) of its rows as words
// 0..7; step s takes words 2s (k = 4t..4t + 3) and 2s + 1 (k = 16 + 4t..), so dims 32t + 4w.. of a
// head sit at bytes 16w + 4t of its row: 16-byte piece w gathers dims 4w.. + 32t for t = 0..3.
// Thread 2n + h takes pieces 4h..4h + 3 of head n (dims 32t + 16h .. + 15, two 16-byte loads for
// each t) and writes each piece of each part with one store; the head's two threads agree on its
// scale.
__device__ void StageQueries(Shared& sh, const IndexerLogitsParams& p, int seq) {
  static_assert(kIndexHeads * 2 == kThreads, "two threads a head");
  const int n = static_cast<int>(threadIdx.x) / 2, h = static_cast<int>(threadIdx.x) % 2;
  const uint4* q =
      reinterpret_cast<const uint4*>(p.index_q + (int64_t{seq} * kIndexHeads + n) * kIndexHeadDim);
  uint32_t bf16[4][8];  // [t][word]: dims 32t + 16h + 2·word, + 1
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint4 lo = q[4 * t + 2 * h], hi = q[4 * t + 2 * h + 1];
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int w = 0; w < 8; ++w) bf16[t][w] = words[w];
  }
  uint32_t amax_bits = e4m3_split::Bf16AbsMaxBits(&bf16[0][0], 32);
  amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 1));
  const float amax = __uint_as_float(amax_bits);
  const int e = e4m3_split::ScaleExponent(amax);
  const float scale = e4m3_split::Pow2(e);
  if (h == 0) sh.unscale[n] = e4m3_split::Pow2(-e);
#pragma unroll
  for (int piece = 0; piece < 4; ++piece) {  // piece 4h + piece: dims 32t + 16h + 4·piece ..
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      e4m3_split::SplitBf16x4(bf16[t][2 * piece], bf16[t][2 * piece + 1], scale, &hi[t], &lo[t]);
    }
    const int at = wgmma::Swizzled128(n, 16 * (4 * h + piece));
    *reinterpret_cast<uint4*>(sh.queries[0] + at) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(sh.queries[1] + at) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  wgmma::FenceSharedWrites();
}

__global__ void __launch_bounds__(kThreads, 4)
    IndexerLogitsKernel(IndexerLogitsParams p, int splits) {
  extern __shared__ uint8_t smem[];
  const uint32_t misalignment = bulk::SharedAddress(smem) % wgmma::kSwizzleAtomBytes;
  Shared& sh = *reinterpret_cast<Shared*>(
      smem + (misalignment == 0 ? 0 : wgmma::kSwizzleAtomBytes - misalignment));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int seq = blockIdx.y;
  const int chunks = (p.logits_stride + kChunk - 1) / kChunk;
  const int per_split = (chunks + splits - 1) / splits;
  const int chunk_begin = blockIdx.x * per_split;
  const int chunk_end = min(chunks, chunk_begin + per_split);
  if (chunk_begin >= chunk_end) return;
  if (threadIdx.x < kStages) bulk::Init(&sh.staged[threadIdx.x], 1);
  bulk::FenceInit();
  LetDependentsLaunch();
  WaitForPredecessor();  // the queries, and the logits the kernel before may still read
  const int32_t len = p.seq_lens[seq];
  // Block sizes are powers of two (PoolSpec): shifts and masks, no divisions on warp 0's path.
  const int block_size = p.cache.block_size, block_shift = __ffs(block_size) - 1;
  const int blocks_per_chunk = kChunk >> block_shift;
  __syncthreads();  // the barriers are initialized

  // Warp 0 stages chunk `chunk` into `stage`: the blocks holding positions before `len`, whole.
  // Only warp 0 reads the table (the other warps' feeds see no entries). It reads as far as the
  // table's row goes rather than the sequence's blocks, so its first reads need not wait for `len`
  // (entries past the sequence are never copied from).
  BlockFeed feed(p.block_tables + int64_t{seq} * p.block_table_stride,
                 warp == 0 ? p.block_table_stride : 0, chunk_begin * blocks_per_chunk);
  auto stage_chunk = [&](int chunk, int stage) {
    const int first = chunk * blocks_per_chunk;
    const int32_t block = feed.Blocks(first, blocks_per_chunk);
    const int whole = max(
        0, min(blocks_per_chunk, (len - (first << block_shift) + block_size - 1) >> block_shift));
    const uint32_t key_bytes = block_size * kIndexHeadDim, scale_bytes = block_size * 4;
    if (lane == 0) bulk::ArriveExpectingBytes(&sh.staged[stage], whole * (key_bytes + scale_bytes));
    __syncwarp();
    if (lane < whole) {
      bulk::Copy(sh.keys[stage] + lane * key_bytes, p.cache.IndexValues(block, 0), key_bytes,
                 &sh.staged[stage]);
      bulk::Copy(&sh.scales[stage][lane * block_size], p.cache.IndexScale(block, 0), scale_bytes,
                 &sh.staged[stage]);
    }
  };
  // Warp 0 has staged chunks [chunk_begin, staged); stage_ahead(chunk) stages up to chunk +
  // kStages - 1, the stages of the chunks before `chunk` being free. Only the first chunk goes
  // before the queries are split, the rest after: at batch 1 every CTA's first copies are in
  // flight at once, and the first chunk then lands without waiting behind the others.
  int staged = chunk_begin;
  auto stage_ahead = [&](int chunk) {
    if (warp != 0) return;
    for (; staged < chunk_end && staged < chunk + kStages; ++staged) {
      stage_chunk(staged, (staged - chunk_begin) % kStages);
    }
  };
  stage_ahead(chunk_begin - kStages + 1);

  // Weights of the D columns this thread holds: heads 8j + 2t and 8j + 2t + 1. Loaded before the
  // queries are converted, so the two wait on memory together.
  float w[kIndexHeads / 8][2];
#pragma unroll
  for (int j = 0; j < kIndexHeads / 8; ++j) {
    const float* hw = p.head_weights + int64_t{seq} * kIndexHeads + 8 * j + 2 * t;
    w[j][0] = hw[0];
    w[j][1] = hw[1];
  }
  StageQueries(sh, p, seq);
  stage_ahead(chunk_begin);
  __syncthreads();  // the heads' unscale factors
#pragma unroll
  for (int j = 0; j < kIndexHeads / 8; ++j) {
    w[j][0] *= sh.unscale[8 * j + 2 * t];
    w[j][1] *= sh.unscale[8 * j + 2 * t + 1];
  }
  const uint64_t queries = wgmma::SwizzledKMajorDescriptor(sh.queries[0]);
  float* out = p.logits + int64_t{seq} * p.logits_stride;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int step = chunk - chunk_begin, stage = step % kStages;
    __syncthreads();  // every warp is done with chunk - 1, whose stage is refilled below
    if (chunk * kChunk >= len) {  // wholly past the end: -inf, nothing to compute
      stage_ahead(chunk);
      const int32_t pos = chunk * kChunk + static_cast<int32_t>(threadIdx.x);
      if (threadIdx.x < kChunk && pos < p.logits_stride) out[pos] = -INFINITY;
      continue;
    }
    bulk::Wait(&sh.staged[stage], (step / kStages) & 1);
    const int row = 16 * warp + g + 8 * t;  // the row whose logit this thread writes (t < 2)
    const float scale = sh.scales[stage][row % kChunk];
    // A fragments of rows 16·warp + g and + 8: bytes [32t, 32t + 32) of each.
    const uint8_t* keys = sh.keys[stage] + (16 * warp + g) * kIndexHeadDim + 32 * t;
    const uint4 r0a = *reinterpret_cast<const uint4*>(keys);
    const uint4 r0b = *reinterpret_cast<const uint4*>(keys + 16);
    const uint4 r1a = *reinterpret_cast<const uint4*>(keys + 8 * kIndexHeadDim);
    const uint4 r1b = *reinterpret_cast<const uint4*>(keys + 8 * kIndexHeadDim + 16);
    const uint32_t k0[kWords] = {r0a.x, r0a.y, r0a.z, r0a.w, r0b.x, r0b.y, r0b.z, r0b.w};
    const uint32_t k1[kWords] = {r1a.x, r1a.y, r1a.z, r1a.w, r1b.x, r1b.y, r1b.z, r1b.w};
    float acc[32];
    wgmma::Fence();
#pragma unroll
    for (int part = 1; part >= 0; --part) {  // the queries' low, then high E4M3 part
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        // (row g, k 4t..), (g + 8, 4t..), (g, 16 + 4t..), (g + 8, 16 + 4t..)
        const uint32_t a[4] = {k0[2 * s], k1[2 * s], k0[2 * s + 1], k1[2 * s + 1]};
        const int offset = part * int{sizeof(sh.queries[0])} + 32 * s;
        wgmma::MmaM64N64K32E4m3(acc, a, wgmma::AdvancedDescriptor(queries, offset),
                                part == 0 || s > 0);
      }
    }
    wgmma::Commit();
    // Warp 0 stages ahead while the tensor cores work, not before the wgmma the others wait on.
    stage_ahead(chunk);
    wgmma::Wait<0>();
    wgmma::KeepAfterWait(acc);
    // Σ_h w_h · ReLU(s_h) of rows g and g + 8, two chains each.
    float sum0[2] = {0.0f, 0.0f}, sum1[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kIndexHeads / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        sum0[c] = fmaf(w[j][c], fmaxf(acc[4 * j + c], 0.0f), sum0[c]);
        sum1[c] = fmaf(w[j][c], fmaxf(acc[4 * j + 2 + c], 0.0f), sum1[c]);
      }
    }
    // Even lanes of the quad gather row g, odd ones row g + 8 (each takes its neighbour's half of
    // that row), then lanes t and t ^ 2 meet: t = 0 ends with row g, t = 1 with row g + 8.
    const bool even = t % 2 == 0;
    float sum = even ? sum0[0] + sum0[1] : sum1[0] + sum1[1];
    sum += __shfl_xor_sync(0xFFFFFFFFu, even ? sum1[0] + sum1[1] : sum0[0] + sum0[1], 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    const int32_t pos = chunk * kChunk + row;
    if (t < 2 && pos < p.logits_stride) out[pos] = pos < len ? sum * scale : -INFINITY;
  }
}

}  // namespace

LaunchStatus IndexerLogitsLaunch(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (!p.cache.has_indexer) return Unsupported("a pool without indexer sections");
  if (p.num_heads != kIndexHeads) return Unsupported("index head counts other than 64");
  if (p.cache.block_size < 16 || kChunk % p.cache.block_size != 0) {
    return Unsupported("indexer block sizes other than 16, 32 and 64");
  }
  if (p.num_seqs == 0 || p.logits_stride == 0) return {};
  static const int resident = [] {
    cudaFuncSetAttribute(IndexerLogitsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kSharedBytes);
    return ResidentCtas(reinterpret_cast<const void*>(IndexerLogitsKernel), kThreads, kSharedBytes);
  }();
  const int chunks = (p.logits_stride + kChunk - 1) / kChunk;
  const int splits = ChooseSplits(p.num_seqs, chunks, resident);
  return LaunchStatus{LaunchDependent(IndexerLogitsKernel, dim3(splits, p.num_seqs), dim3(kThreads),
                                      kSharedBytes, stream, false, p, splits),
                      nullptr};
}

}  // namespace kvp
