// Keeps freed memory in the process for reuse. kvpool's processes pass megabyte messages (decode
// outputs) every step; with glibc's defaults each one is a fresh mmap whose pages fault in and are
// zeroed again, which costs more than copying the bytes. Call once at the top of main().
#pragma once

#include <malloc.h>

namespace kvp {

inline void KeepFreedMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum: blocks below this come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and are not handed back to the kernel when freed
}

}  // namespace kvp
