// Indexer logits with tensor cores, streamed: a CTA walks a range of 64-position chunks of one
// sequence through a cp.async pipeline (FP8 key rows and their scales, kStages deep, the rows'
// addresses worked out a chunk ahead), so loading the next chunks overlaps computing this one.
//
// Per chunk, warp w takes 32 positions (w / 2) by 32 heads (w % 2): Sᵀ = K·Qᵀ with the keys as A
// fragments (thread t takes 32 contiguous key bytes of a row, as in attention) and its 32 heads'
// queries as B fragments held in registers for the whole kernel (four n-tiles). ReLU and the head
// weights apply in registers; the heads of a row sit in one quad, so two shuffles sum them; each
// half's sum is multiplied by the position's scale (positive, so it commutes with ReLU) while its
// stage is still there, and the halves meet in shared memory. A chunk's logits are written during
// the next one (the partial sums alternate between two buffers).
#include <cstdint>

#include "kernels/common/cp_async.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/common/work_split.h"
#include "kernels/indexer_logits/indexer_logits_launch.h"

namespace kvp {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 64;                  // positions per pipeline step
constexpr int kStages = 4;                  // chunks in flight or being computed
constexpr int kRow = kIndexHeadDim + 16;    // staged key row, padded against bank conflicts
constexpr int kSteps = kIndexHeadDim / 16;  // k-steps of K·Qᵀ
constexpr int kHeadsPerWarp = kIndexHeads / 2;
constexpr int kNTiles = kHeadsPerWarp / 8;
constexpr int kMetaSlots = kStages + 1;  // one longer than the stages: see ChunkStream

struct Shared {
  uint8_t keys[kStages][kChunk * kRow];
  float scales[kStages][kChunk];
  float partial[2][2][kChunk];  // [chunk parity][head half][position]
  // Per chunk in flight: each position's key row and scale address, bit 0 set when masked.
  uintptr_t rows[kMetaSlots][2][kChunk];
};

struct Stream {
  const IndexerLogitsParams& p;
  const int32_t* table;
  int32_t len;
  int block_shift;

  // Records position `pos` (or -1 = masked, for a position at or past the sequence's end) as
  // entry threadIdx.x of ring slot `meta`.
  __device__ void SetRows(Shared& sh, int meta, int32_t pos, int32_t block) const {
    const int32_t slot = pos >= 0 ? pos & ((1 << block_shift) - 1) : 0;
    const uintptr_t masked = pos >= 0 ? 0 : 1;
    sh.rows[meta][0][threadIdx.x] =
        reinterpret_cast<uintptr_t>(p.cache.IndexValues(block, slot)) | masked;
    sh.rows[meta][1][threadIdx.x] =
        reinterpret_cast<uintptr_t>(p.cache.IndexScale(block, slot)) | masked;
  }
  __device__ int32_t Position(int chunk) const {
    const int32_t pos = chunk * kChunk + static_cast<int32_t>(threadIdx.x);
    return pos < len ? pos : -1;
  }
  __device__ int32_t BlockOf(int32_t pos) const { return pos >= 0 ? table[pos >> block_shift] : 0; }

  // Stages the chunk whose rows are in ring slot `meta`: thread t copies 16-byte piece t % 8 of
  // rows t / 8 + 16 r (a warp-wide copy covers four whole 128-byte rows); threads 0..63 copy the
  // scales. Masked positions become zeros.
  __device__ void Issue(Shared& sh, int stage, int meta) const {
    const int piece = (threadIdx.x % 8) * 16;
#pragma unroll
    for (int r = 0; r < kChunk / (kThreads / 8); ++r) {
      const int i = threadIdx.x / 8 + r * (kThreads / 8);
      const uintptr_t row = sh.rows[meta][0][i];
      const uint32_t masked = static_cast<uint32_t>(row) & 1u;
      cp_async::CopyOrZero<16>(sh.keys[stage] + i * kRow + piece,
                               reinterpret_cast<const uint8_t*>(row) + (piece - masked),
                               masked == 0);
    }
    if (threadIdx.x < kChunk) {
      const uintptr_t at = sh.rows[meta][1][threadIdx.x];
      const uint32_t masked = static_cast<uint32_t>(at) & 1u;
      cp_async::CopyOrZero<4>(&sh.scales[stage][threadIdx.x],
                              reinterpret_cast<const uint8_t*>(at - masked), masked == 0);
    }
  }
};

__global__ void __launch_bounds__(kThreads, 4)
    IndexerLogitsKernel(IndexerLogitsParams p, int splits) {
  extern __shared__ __align__(16) uint8_t smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int seq = blockIdx.y;
  const int half = warp % 2;              // heads half · 32 ..
  const int first_row = (warp / 2) * 32;  // positions of the chunk this warp computes
  LetDependentsLaunch();
  WaitForPredecessor();  // the queries, and the logits the kernel before may still read
  Stream stream{p, p.block_tables + int64_t{seq} * p.block_table_stride, p.seq_lens[seq],
                __ffs(p.cache.block_size) - 1};
  const int chunks = (p.logits_stride + kChunk - 1) / kChunk;
  const int per_split = (chunks + splits - 1) / splits;
  const int chunk_begin = blockIdx.x * per_split;
  const int chunk_end = min(chunks, chunk_begin + per_split);
  if (chunk_begin >= chunk_end) return;

  // B fragments: head n = g of n-tile nt is head half·32 + nt·8 + g; dims permuted as in mma.cuh.
  uint32_t qb[kNTiles][kSteps][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const uint16_t* q =
        reinterpret_cast<const uint16_t*>(p.index_q) +
        (int64_t{seq} * kIndexHeads + half * kHeadsPerWarp + nt * 8 + g) * kIndexHeadDim;
#pragma unroll
    for (int s = 0; s < kSteps; s += 2) {  // 16 bytes: dims of k-steps s and s + 1
      uint32_t pairs[4];
      mma::Bf16x8ToHalf2x4(q + t * (kIndexHeadDim / 4) + 4 * s, pairs);
      qb[nt][s][0] = pairs[0];
      qb[nt][s][1] = pairs[1];
      qb[nt][s + 1][0] = pairs[2];
      qb[nt][s + 1][1] = pairs[3];
    }
  }
  // Weights of the C columns this thread holds: heads nt·8 + 2t and nt·8 + 2t + 1 of its half.
  float w[kNTiles][2];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const float* hw = p.head_weights + int64_t{seq} * kIndexHeads + half * kHeadsPerWarp + nt * 8;
    w[nt][0] = hw[2 * t];
    w[nt][1] = hw[2 * t + 1];
  }

  const bool loader = threadIdx.x < kChunk;
  if (loader) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int32_t pos = chunk_begin + s < chunk_end ? stream.Position(chunk_begin + s) : -1;
      stream.SetRows(sh, s, pos, stream.BlockOf(pos));
    }
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (chunk_begin + s < chunk_end) stream.Issue(sh, s, s);
    cp_async::Commit();
  }
  float* out = p.logits + int64_t{seq} * p.logits_stride;
  // Writes chunk `chunk`'s logits from the partial sums of its parity.
  auto write = [&](int chunk) {
    const int32_t pos = chunk * kChunk + static_cast<int32_t>(threadIdx.x);
    if (!loader || pos >= p.logits_stride) return;
    const int parity = chunk & 1;
    out[pos] = pos < stream.len
                   ? sh.partial[parity][0][threadIdx.x] + sh.partial[parity][1][threadIdx.x]
                   : -INFINITY;
  };
  int32_t later =
      loader && chunk_begin + kStages < chunk_end ? stream.Position(chunk_begin + kStages) : -1;
  int stage = 0, issue_stage = kStages - 1;
  int meta = 0, issue_meta = kStages - 1, fill_meta = kStages;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    cp_async::Wait<kStages - 2>();
    __syncthreads();  // chunk is staged; chunk - 1's partial sums are complete, its stage is free
    if (chunk + kStages - 1 < chunk_end) stream.Issue(sh, issue_stage, issue_meta);
    cp_async::Commit();
    const int32_t fill_pos = later;
    int32_t fill_block = 0;
    if (loader) {
      fill_block = stream.BlockOf(fill_pos);
      later = chunk + kStages + 1 < chunk_end ? stream.Position(chunk + kStages + 1) : -1;
    }
    if (chunk > chunk_begin) write(chunk - 1);
    if (chunk * kChunk < stream.len) {  // a chunk wholly past the end is -inf, nothing to compute
      const uint8_t* keys = sh.keys[stage];
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        const int base = first_row + tile * 16;
        const uint8_t* row0 = keys + (base + g) * kRow + t * (kIndexHeadDim / 4);
        const uint8_t* row1 = row0 + 8 * kRow;
        const uint4 a0 = *reinterpret_cast<const uint4*>(row0);
        const uint4 a1 = *reinterpret_cast<const uint4*>(row0 + 16);
        const uint4 b0 = *reinterpret_cast<const uint4*>(row1);
        const uint4 b1 = *reinterpret_cast<const uint4*>(row1 + 16);
        const uint32_t k0[kSteps] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const uint32_t k1[kSteps] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
        float acc[kNTiles][4] = {};
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          uint32_t a[4];  // (row g, dims 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)
          mma::E4m3x4ToHalf2x2(k0[s], &a[0], &a[2]);
          mma::E4m3x4ToHalf2x2(k1[s], &a[1], &a[3]);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) mma::MmaF16(acc[nt], a, qb[nt][s][0], qb[nt][s][1]);
        }
        float sum0 = 0.0f, sum1 = 0.0f;  // rows base + g and base + g + 8
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          sum0 += w[nt][0] * fmaxf(acc[nt][0], 0.0f) + w[nt][1] * fmaxf(acc[nt][1], 0.0f);
          sum1 += w[nt][0] * fmaxf(acc[nt][2], 0.0f) + w[nt][1] * fmaxf(acc[nt][3], 0.0f);
        }
#pragma unroll
        for (int mask = 1; mask < 4; mask *= 2) {
          sum0 += __shfl_xor_sync(0xFFFFFFFFu, sum0, mask);
          sum1 += __shfl_xor_sync(0xFFFFFFFFu, sum1, mask);
        }
        if (t == 0) {
          sh.partial[chunk & 1][half][base + g] = sum0 * sh.scales[stage][base + g];
          sh.partial[chunk & 1][half][base + g + 8] = sum1 * sh.scales[stage][base + g + 8];
        }
      }
    }
    if (loader) stream.SetRows(sh, fill_meta, fill_pos, fill_block);
    stage = stage + 1 == kStages ? 0 : stage + 1;
    issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
    meta = meta + 1 == kMetaSlots ? 0 : meta + 1;
    issue_meta = issue_meta + 1 == kMetaSlots ? 0 : issue_meta + 1;
    fill_meta = fill_meta + 1 == kMetaSlots ? 0 : fill_meta + 1;
  }
  cp_async::Wait<0>();
  __syncthreads();
  write(chunk_end - 1);
}

}  // namespace

LaunchStatus IndexerLogitsLaunch(const IndexerLogitsParams& p, cudaStream_t stream) {
  if (!p.cache.has_indexer) return Unsupported("a pool without indexer sections");
  if (p.num_heads != kIndexHeads) return Unsupported("index head counts other than 64");
  if (p.num_seqs == 0 || p.logits_stride == 0) return {};
  static const int resident = [] {
    cudaFuncSetAttribute(IndexerLogitsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         sizeof(Shared));
    return ResidentCtas(reinterpret_cast<const void*>(IndexerLogitsKernel), kThreads,
                        sizeof(Shared));
  }();
  const int chunks = (p.logits_stride + kChunk - 1) / kChunk;
  const int splits = ChooseSplits(p.num_seqs, chunks, resident);
  return LaunchStatus{LaunchDependent(IndexerLogitsKernel, dim3(splits, p.num_seqs), dim3(kThreads),
                                      sizeof(Shared), stream, false, p, splits),
                      nullptr};
}

}  // namespace kvp
