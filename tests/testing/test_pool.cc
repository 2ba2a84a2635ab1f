#include "tests/testing/test_pool.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "kvpool/format/indexer_quant.h"

namespace kvp::testing {

TestPool::TestPool(const PoolSpec& spec, int64_t num_blocks)
    : layout_(BlockLayout::Create(spec).value()),
      num_blocks_(num_blocks),
      arena_(num_blocks * layout_.block_stride(), kUnusedByte) {}

void TestPool::FillSequences(std::mt19937_64& rng, const std::vector<int32_t>& seq_lens,
                             float k_std, float v_std) {
  const PoolSpec& spec = layout_.spec();
  seq_lens_ = seq_lens;
  int32_t max_len = 1;
  int64_t blocks_needed = 0;
  for (int32_t len : seq_lens) {
    max_len = std::max(max_len, len);
    blocks_needed += BlocksForTokens(len, spec.block_size);
  }
  // One block stays unwritten (all NaN): unused table entries point at it, so a kernel that reads
  // past seq_len reads NaN.
  if (blocks_needed + 1 > num_blocks_) throw std::invalid_argument("TestPool: too few blocks");
  block_table_stride_ = static_cast<int32_t>(BlocksForTokens(max_len, spec.block_size));

  std::vector<int32_t> free_blocks(num_blocks_);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  const int32_t poison_block = free_blocks.back();
  block_tables_.assign(seq_lens.size() * block_table_stride_, poison_block);
  size_t next = 0;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int32_t blocks = static_cast<int32_t>(BlocksForTokens(seq_lens[s], spec.block_size));
    for (int32_t b = 0; b < blocks; ++b) {
      block_tables_[s * block_table_stride_ + b] = free_blocks[next++];
    }
  }

  const int row = spec.num_kv_heads * spec.head_dim;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    const int32_t len = seq_lens[s];
    std::vector<int64_t> slots(len);
    for (int32_t t = 0; t < len; ++t) {
      slots[t] = SlotOfPosition(&block_tables_[s * block_table_stride_], t, spec.block_size);
    }
    for (int l = 0; l < spec.num_layers; ++l) {
      const std::vector<Bf16> k = RandomBf16(rng, static_cast<size_t>(len) * row, k_std);
      const std::vector<Bf16> v = RandomBf16(rng, static_cast<size_t>(len) * row, v_std);
      const std::vector<Bf16> index_k = RandomBf16(rng, static_cast<size_t>(len) * kIndexHeadDim);
      CacheWriteParams p;
      p.cache = Layer(l);
      p.k = k.data();
      p.v = v.data();
      p.index_k = spec.indexer ? index_k.data() : nullptr;
      p.slot_mapping = slots.data();
      p.num_tokens = len;
      if (!CacheWriteRef(p).ok()) throw std::runtime_error("TestPool: cache write failed");
    }
  }
}

}  // namespace kvp::testing
