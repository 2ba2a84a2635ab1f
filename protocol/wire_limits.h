// How much a reader accepts from the wire (docs/design.md §6): one place for the numbers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/kvpool.capnp.h"

namespace kvp {

struct WireLimits {
  size_t max_message_bytes = size_t{256} << 20;  // a long prompt's K/V tensors fit
  size_t max_segments = 512;
  // Cap'n Proto traversal limit, in 8-byte words: a legitimate message is read about once, so
  // twice its size stops pointer-amplification without refusing real traffic.
  uint64_t traversal_words_per_message_word = 2;
  // What handlers may read afterwards (fields read more than once, lists walked twice).
  uint64_t handler_reads_per_message_word = 64;
  int nesting_limit = 16;  // the schema nests 7 deep at most
  // The receiver's pool, for lists the schema bounds by it ($boundBy): the largest pool a spec
  // allows until the receiver knows its own.
  uint64_t max_layers = wire::MAX_LAYERS;
  uint64_t max_blocks = uint64_t{1} << 31;  // BlockId is int32
};

}  // namespace kvp
