// Flag files (--flagfile=PATH, as systemd units and Kubernetes ConfigMaps pass them): read and
// checked by us before Abseil parses the flags, so that a malformed or hostile file is one clear
// start-up error and never reaches a parser that exits or misreads it.
//
// A flag file holds one flag a line, "--name" or "--name=value" (name: letters, digits, '_');
// blank lines and lines starting with '#' are skipped. It may name further flag files, up to
// kMaxFlagFileDepth deep, never itself or a file that includes it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvp {

inline constexpr size_t kMaxFlagFileBytes = size_t{1} << 20;
inline constexpr int kMaxFlagFileDepth = 4;

// The flags of one file's text; INVALID_ARGUMENT naming `path`:line for anything else.
absl::StatusOr<std::vector<std::string>> ParseFlagFileText(absl::string_view text,
                                                           absl::string_view path);

// argv with every --flagfile=PATH replaced by that file's flags (recursively), in order.
// NOT_FOUND for a file that cannot be read, INVALID_ARGUMENT for a malformed one.
absl::StatusOr<std::vector<std::string>> ExpandFlagFiles(int argc, char** argv);

// absl::ParseCommandLine over argv with its flag files expanded first: the positional arguments
// (pointing into `storage`). Abseil still exits on an unknown flag or a bad value (in main, with
// a message naming it).
absl::StatusOr<std::vector<char*>> ParseCommandLineWithFlagFiles(int argc, char** argv,
                                                                 std::vector<std::string>& storage);

}  // namespace kvp
