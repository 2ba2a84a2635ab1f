#include "base/bounded_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvp {

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " ", path, ": ", std::strerror(errno)));
  }
  // One byte more than allowed tells an over-long file from one of exactly max_bytes.
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " is over ", max_bytes, " bytes"));
  }
  return text;
}

}  // namespace kvp
