// Whole-file reads and crash-safe writes for the command-line tools.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvp {

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// Writes to a temporary file beside `path`, then renames it over `path`: a failed write never
// leaves a truncated file behind.
absl::Status WriteFileAtomically(const std::string& path, absl::Span<const uint8_t> bytes);

}  // namespace kvp
