// Names of the cache formats, as flags, files and messages spell them.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvpool/format/kv_format.h"

namespace kvp {

// "bf16", "fp8_e4m3", "turbo2", "turbo3", "turbo4", "indexer".
absl::string_view KvFormatName(KvFormat format);

// Inverse of KvFormatName; INVALID_ARGUMENT naming the known formats otherwise.
absl::StatusOr<KvFormat> ParseKvFormat(absl::string_view name);

}  // namespace kvp
