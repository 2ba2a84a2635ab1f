#include "daemon/state/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status_macros.h"

namespace kvp {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  const std::string text = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  return e == ENOENT ? absl::NotFoundError(text) : absl::InternalError(text);
}

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("writing", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

std::string FrameRecord(absl::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU32(out, Crc32c(payload));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<RecordFileContents> ReadRecordFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Errno("opening", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Errno("reading the size of", path);
  // Never the small-string buffer: the views below must survive moving the string.
  std::string data(std::max<size_t>(static_cast<size_t>(st.st_size), 64), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("reading", path);
    if (n == 0) break;
    if (got + static_cast<size_t>(n) >= static_cast<size_t>(st.st_size)) {
      got += static_cast<size_t>(n);
      break;
    }
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  if (absl::string_view(data).substr(0, kRecordFileMagic.size()) != kRecordFileMagic) {
    return absl::DataLossError(absl::StrCat(path, " is not a kvpool state file (no magic word)"));
  }
  RecordFileContents contents;
  size_t at = kRecordFileMagic.size();
  while (data.size() - at >= 8) {
    const uint32_t bytes = GetU32(data.data() + at);
    const uint32_t crc = GetU32(data.data() + at + 4);
    if (bytes > data.size() - at - 8) break;  // cut short
    const absl::string_view payload(data.data() + at + 8, bytes);
    if (Crc32c(payload) != crc) break;
    contents.records.push_back(payload);
    at += 8 + bytes;
  }
  contents.valid_bytes = at;
  contents.torn_bytes = data.size() - at;
  contents.data = std::move(data);  // a move keeps the views valid (the buffer is on the heap)
  return contents;
}

absl::StatusOr<RecordWriter> RecordWriter::Replace(const std::string& path,
                                                   const std::vector<std::string>& records) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Errno("creating", tmp);
  std::string bytes(kRecordFileMagic.data(), kRecordFileMagic.size());
  for (const std::string& r : records) {
    if (r.size() >= kMaxRecordBytes) {
      return absl::ResourceExhaustedError(absl::StrCat("a state record of ", r.size(), " bytes"));
    }
    bytes += FrameRecord(r);
  }
  RETURN_IF_ERROR(WriteAll(fd.get(), bytes, tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("renaming to", path);
  RecordWriter w;
  w.path_ = path;
  w.fd_ = std::move(fd);
  w.bytes_ = bytes.size();
  if (::lseek(w.fd_.get(), 0, SEEK_END) < 0) return Errno("seeking", path);
  return w;
}

absl::StatusOr<RecordWriter> RecordWriter::Continue(const std::string& path,
                                                    uint64_t valid_bytes) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Errno("opening", path);
  if (::ftruncate(fd.get(), static_cast<off_t>(valid_bytes)) != 0) return Errno("truncating", path);
  if (::lseek(fd.get(), 0, SEEK_END) < 0) return Errno("seeking", path);
  RecordWriter w;
  w.path_ = path;
  w.fd_ = std::move(fd);
  w.bytes_ = valid_bytes;
  return w;
}

absl::Status RecordWriter::Append(absl::string_view payload) {
  if (payload.size() >= kMaxRecordBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a state record of ", payload.size(), " bytes"));
  }
  const std::string framed = FrameRecord(payload);
  RETURN_IF_ERROR(WriteAll(fd_.get(), framed, path_));
  bytes_ += framed.size();
  return absl::OkStatus();
}

}  // namespace kvp
