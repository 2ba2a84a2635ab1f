// A host-memory pool for reference-kernel tests: an arena whose unused bytes are 0xFF (NaN in every
// format, so reading an unwritten slot poisons the result), sequences of random bf16 tokens written
// through the cache-write reference, and shuffled block tables.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cache_write/cache_write_ref.h"
#include "kvpool/format/bf16.h"
#include "kvpool/layout/block_layout.h"
#include "tests/testing/test_data.h"

namespace kvp::testing {

inline constexpr uint8_t kUnusedByte = 0xFF;

class TestPool {
 public:
  // REQUIRES: spec is valid.
  TestPool(const PoolSpec& spec, int64_t num_blocks);

  const BlockLayout& layout() const { return layout_; }
  LayerCache Layer(int layer) { return layout_.Layer(arena_.data(), num_blocks_, layer); }
  std::vector<uint8_t>& arena() { return arena_; }
  int64_t num_blocks() const { return num_blocks_; }

  // Gives each of `seq_lens.size()` sequences distinct random blocks and writes random tokens
  // (K, V and index K; the given stddevs) into every layer; the block table is
  // [num_seqs, block_table_stride()], its unused entries naming a never-written (NaN) block.
  void FillSequences(std::mt19937_64& rng, const std::vector<int32_t>& seq_lens, float k_std = 1.0f,
                     float v_std = 1.0f);

  const std::vector<int32_t>& block_tables() const { return block_tables_; }
  const std::vector<int32_t>& seq_lens() const { return seq_lens_; }
  int32_t block_table_stride() const { return block_table_stride_; }

 private:
  BlockLayout layout_;
  int64_t num_blocks_;
  std::vector<uint8_t> arena_;
  std::vector<int32_t> block_tables_;
  std::vector<int32_t> seq_lens_;
  int32_t block_table_stride_ = 0;
};

}  // namespace kvp::testing
