#include "protocol/curve.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/bounded_file.h"
#include "base/status_macros.h"

namespace kvp {
namespace {

constexpr size_t kZ85KeyChars = 40;
constexpr size_t kKeyBytes = 32;
constexpr size_t kMaxKeyFileBytes = size_t{1} << 20;

absl::StatusOr<std::vector<std::string>> KeyLines(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(path, kMaxKeyFileBytes, "CURVE key file"));
  return ParseCurveKeyLines(text, path);
}

}  // namespace

absl::StatusOr<std::string> DecodeZ85Key(absl::string_view text) {
  if (text.size() != kZ85KeyChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CURVE key is ", kZ85KeyChars, " Z85 characters, not ", text.size()));
  }
  const std::string z85(text);
  std::string raw(kKeyBytes, '\0');
  if (zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), z85.c_str()) == nullptr) {
    return absl::InvalidArgumentError("a CURVE key holds characters that are not Z85");
  }
  return raw;
}

absl::StatusOr<std::vector<std::string>> ParseCurveKeyLines(absl::string_view text,
                                                            absl::string_view path) {
  std::vector<std::string> keys;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (key.empty() || key.front() == '#') continue;
    if (absl::Status valid = DecodeZ85Key(key).status(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", valid.message()));
    }
    keys.emplace_back(key);
  }
  return keys;
}

absl::StatusOr<CurveKeyPair> NewCurveKeyPair() {
  char public_key[kZ85KeyChars + 1], secret_key[kZ85KeyChars + 1];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    return absl::UnimplementedError(
        absl::StrCat("this ZeroMQ cannot make CURVE keys: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{public_key, secret_key};
}

absl::StatusOr<CurveKeyPair> CurveKeyPairFromSecret(const std::string& secret_key) {
  RETURN_IF_ERROR(DecodeZ85Key(secret_key).status());
  char public_key[kZ85KeyChars + 1];
  if (zmq_curve_public(public_key, secret_key.c_str()) != 0) {
    return absl::UnimplementedError(
        absl::StrCat("this ZeroMQ has no CURVE: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{public_key, secret_key};
}

absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> keys, KeyLines(path));
  if (keys.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CURVE key file ", path, " holds ", keys.size(), " keys, not one"));
  }
  return keys.front();
}

absl::StatusOr<std::vector<std::string>> ReadCurveKeyListFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<std::string> keys, KeyLines(path));
  std::vector<std::string> raw;
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(std::string bytes, DecodeZ85Key(key));
    raw.push_back(std::move(bytes));
  }
  return raw;
}

absl::Status WriteCurveKeyFile(const std::string& path, const std::string& key, int mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    if (errno == EEXIST)
      return absl::AlreadyExistsError(absl::StrCat(path, " exists; not replaced"));
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", why));
  }
  const std::string text = key + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

void UseCurveClientKeys(zmq::socket_t& socket, const CurveClientKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, keys.server_public_key);
  socket.set(zmq::sockopt::curve_publickey, keys.own.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.own.secret_key);
}

}  // namespace kvp
