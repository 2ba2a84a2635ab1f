// Reading a small configuration file (flag files, CURVE key files) whole, with a size bound, so
// that a wrong path pointed at a large or endless file is one clear error instead of memory use.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvp {

// The bytes of `path`. NOT_FOUND (with errno's text) when it cannot be opened; INVALID_ARGUMENT
// when it holds more than `max_bytes`. `what` names the file in messages ("flag file").
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            absl::string_view what);

}  // namespace kvp
