#include "kvpool/format/kv_format_names.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace kvp {
namespace {

constexpr std::array<absl::string_view, kNumKvFormats> kNames = {"bf16",   "fp8_e4m3", "turbo2",
                                                                 "turbo3", "turbo4",   "indexer"};

}  // namespace

absl::string_view KvFormatName(KvFormat format) {
  const auto i = static_cast<size_t>(format);
  return i < kNames.size() ? kNames[i] : absl::string_view("unknown");
}

absl::StatusOr<KvFormat> ParseKvFormat(absl::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<KvFormat>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown format '", name,
                   "'; expected one of bf16, fp8_e4m3, turbo2, turbo3, turbo4, indexer"));
}

}  // namespace kvp
