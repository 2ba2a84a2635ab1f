// Indexer logits with warpgroup tensor cores, streamed: a CTA (one warpgroup) walks a range of
// 64-position chunks of one sequence. Warp 0 keeps kStages - 1 chunks in flight, each as one bulk
// copy of every cache block's keys and one of its scales (a chunk is 64 / block_size whole blocks),
// counted on the stage's barrier; the table entries come 32 at a time, a window ahead.
//
// Per chunk, Sᵀ = K·Qᵀ is eight wgmma m64n64k16: the 64 positions are the rows of A, which each
// warp converts from FP8 to f16 in registers (thread t takes 32 contiguous key bytes of a row, as
// in attention), and the 64 heads' queries are B, converted once per CTA into shared memory in the
// same k order. ReLU and the head weights apply to the accumulators; the heads of a row sit in one
// quad, so two shuffles sum them, and the position's scale (positive, so it commutes with ReLU)
// finishes the logit.
#include <cstdint>

#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/common/work_split.h"
#include "kernels/indexer_logits/indexer_logits_launch.h"

namespace kvp {
namespace {

constexpr int kThreads = 128;               // one warpgroup
constexpr int kChunk = 64;                  // positions per pipeline step: the M of one wgmma
constexpr int kStages = 4;                  // chunks in flight or being computed
constexpr int kSteps = kIndexHeadDim / 16;  // k-steps of K·Qᵀ
constexpr int kStepsPerAtom = wgmma::kSwizzleRowBytes / 32;  // a k-step is 16 f16 = 32 bytes
static_assert(kIndexHeadDim == wgmma::kSwizzleRowBytes, "a query row is one swizzled row");
static_assert(kIndexHeads == 64, "the heads are the N of one m64n64 wgmma");

struct Shared {
  // B: the queries as f16, head rows, k in the A fragments' order; k-steps 4a..4a+3 in queries[a].
  uint8_t queries[kSteps / kStepsPerAtom][kIndexHeads * wgmma::kSwizzleRowBytes];
  uint8_t keys[kStages][kChunk * kIndexHeadDim];  // the chunk's key rows, as in the cache
  float scales[kStages][kChunk];
  uint64_t staged[kStages];  // completes when the stage's bytes have landed
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
  // Entry `index` + lane % per_chunk for every lane; `index` only grows, by at most 32 a call.
  __device__ int32_t Blocks(int index, int per_chunk) {
    if (index >= window_ + 32) {
      window_ += 32;
      current_ = next_;
      next_ = Entry(window_ + 32 + Lane());
    }
    return __shfl_sync(0xFFFFFFFFu, current_, index - window_ + Lane() % per_chunk);
  }

 private:
  __device__ static int Lane() { return static_cast<int>(threadIdx.x % 32); }
  __device__ int32_t Entry(int index) const { return index < blocks_ ? table_[index] : 0; }

  const int32_t* table_;
  int32_t blocks_;  // entries that may be read
  int window_;
  int32_t current_, next_;
};

// Converts sequence `seq`'s queries to f16 B rows in shared memory, k in the order the A fragments
// give the key dims: thread t of a quad holds dims [32t, 32t + 32) of its rows, 4 per k-step, so
// the pair (k, k + 1) of step s (k even) is dims 32·((k % 8) / 2) + 4s + (k >= 8 ? 2 : 0), + 1.
// Item i = n·4 + t converts dims [32t, 32t + 32) of head n.
__device__ void StageQueries(Shared& sh, const IndexerLogitsParams& p, int seq) {
  static_assert(kIndexHeads * 4 % kThreads == 0, "whole items a thread");
  // A fixed count of items a thread, unrolled, so all of a thread's loads are in flight at once.
#pragma unroll
  for (int i = 0; i < kIndexHeads * 4 / kThreads; ++i) {
    const int item = static_cast<int>(threadIdx.x) + i * kThreads;
    const int n = item / 4, t = item % 4;
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p.index_q) +
                        (int64_t{seq} * kIndexHeads + n) * kIndexHeadDim + 32 * t;
#pragma unroll
    for (int step = 0; step < kSteps; step += 2) {  // 8 dims: steps `step` and `step` + 1
      uint32_t pairs[4];
      mma::Bf16x8ToHalf2x4(q + 4 * step, pairs);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int s = step + i / 2, k = 2 * t + 8 * (i % 2);  // pairs[i] is (k, k + 1) of step s
        uint8_t* atom = sh.queries[s / kStepsPerAtom];
        *reinterpret_cast<uint32_t*>(
            atom + wgmma::Swizzled128(n, (s % kStepsPerAtom) * 32 + 2 * k)) = pairs[i];
      }
    }
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
  const int block_size = p.cache.block_size;
  const int blocks_per_chunk = kChunk / block_size;
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
    const int whole =
        max(0, min(blocks_per_chunk, (len - first * block_size + block_size - 1) / block_size));
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
  if (warp == 0) {
    for (int s = 0; s < kStages - 1 && chunk_begin + s < chunk_end; ++s) {
      stage_chunk(chunk_begin + s, s);
    }
  }

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
  const uint64_t queries = wgmma::SwizzledKMajorDescriptor(sh.queries[0]);
  float* out = p.logits + int64_t{seq} * p.logits_stride;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int step = chunk - chunk_begin, stage = step % kStages;
    __syncthreads();  // every warp is done with chunk - 1 (and the queries are staged)
    const int ahead = chunk + kStages - 1;
    if (warp == 0 && ahead < chunk_end) stage_chunk(ahead, (step + kStages - 1) % kStages);
    if (chunk * kChunk >= len) {  // wholly past the end: -inf, nothing to compute
      const int32_t pos = chunk * kChunk + static_cast<int32_t>(threadIdx.x);
      if (threadIdx.x < kChunk && pos < p.logits_stride) out[pos] = -INFINITY;
      continue;
    }
    bulk::Wait(&sh.staged[stage], (step / kStages) & 1);
    // A fragments of rows 16·warp + g and + 8: bytes [32t, 32t + 32) of each.
    const uint8_t* keys = sh.keys[stage] + (16 * warp + g) * kIndexHeadDim + 32 * t;
    const uint4 r0a = *reinterpret_cast<const uint4*>(keys);
    const uint4 r0b = *reinterpret_cast<const uint4*>(keys + 16);
    const uint4 r1a = *reinterpret_cast<const uint4*>(keys + 8 * kIndexHeadDim);
    const uint4 r1b = *reinterpret_cast<const uint4*>(keys + 8 * kIndexHeadDim + 16);
    const uint32_t k0[kSteps] = {r0a.x, r0a.y, r0a.z, r0a.w, r0b.x, r0b.y, r0b.z, r0b.w};
    const uint32_t k1[kSteps] = {r1a.x, r1a.y, r1a.z, r1a.w, r1b.x, r1b.y, r1b.z, r1b.w};
    uint32_t a[kSteps][4];  // (row g, k 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      mma::E4m3x4ToHalf2x2(k0[s], &a[s][0], &a[s][2]);
      mma::E4m3x4ToHalf2x2(k1[s], &a[s][1], &a[s][3]);
    }
    float acc[32];
    wgmma::Fence();
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int offset =
          (s / kStepsPerAtom) * int{sizeof(sh.queries[0])} + (s % kStepsPerAtom) * 32;
      wgmma::MmaM64N64K16(acc, a[s], wgmma::AdvancedDescriptor(queries, offset), s > 0);
    }
    wgmma::Commit();
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
    const int row = 16 * warp + g + 8 * t;
    const int32_t pos = chunk * kChunk + row;
    if (t < 2 && pos < p.logits_stride) {
      out[pos] = pos < len ? sum * sh.scales[stage][row] : -INFINITY;
    }
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
