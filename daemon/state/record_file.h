// Files of checksummed records, the form of kvpoold's state log (docs/design.md §10): an 8-byte
// magic word, then records of [u32 payload bytes][u32 CRC-32C of the payload][payload], little-
// endian. A record is there whole or not at all: reading stops at the first record that is cut
// short or fails its checksum (a write torn by a crash), and reports the bytes it dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvpool/arena/unique_fd.h"

namespace kvp {

inline constexpr absl::string_view kRecordFileMagic = "kvpoolS1";
inline constexpr uint32_t kMaxRecordBytes = uint32_t{1} << 31;

struct RecordFileContents {
  std::string data;                        // the whole file
  std::vector<absl::string_view> records;  // payloads, in `data`
  uint64_t valid_bytes = 0;  // magic and whole records
  uint64_t torn_bytes = 0;   // what followed them
};

// NOT_FOUND when `path` does not exist; DATA_LOSS when it is not a record file.
absl::StatusOr<RecordFileContents> ReadRecordFile(const std::string& path);

// Appends records to a file it created. Move-only.
class RecordWriter {
 public:
  // Writes `records` to `path`.tmp and renames it over `path`, so a crash leaves either the old
  // file or the new one, then appends to it.
  static absl::StatusOr<RecordWriter> Replace(const std::string& path,
                                              const std::vector<std::string>& records);
  // Appends to an existing record file after its first `valid_bytes` (what ReadRecordFile found
  // whole), dropping a torn tail.
  static absl::StatusOr<RecordWriter> Continue(const std::string& path, uint64_t valid_bytes);

  // One record, one write(2). Nothing is synced: in the page cache, a record survives the
  // process (kvpoold's crash), and what it describes, GPU or shared memory, does not survive
  // the machine anyway.
  absl::Status Append(absl::string_view payload);

  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t bytes_ = 0;
};

// The framed form of `payload` (length, checksum, payload).
std::string FrameRecord(absl::string_view payload);

}  // namespace kvp
