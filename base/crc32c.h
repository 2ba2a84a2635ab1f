// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of kvpoold's state log
// records: the same function as iSCSI, ext4 and LevelDB use, so any tool can check a record.
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvp {

// Continues a CRC-32C over `data` (start with crc = 0). Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace kvp
