// CURVE keys for kvpoold's tcp:// endpoint (docs/design.md §8): kvpoold holds a secret key and a
// list of the client public keys it admits; a client holds kvpoold's public key and its own key
// pair. Keys are ZeroMQ's Z85 text, 40 characters for 32 bytes, one per file (or per line of the
// allow list; a line starting with '#' is a comment), so they can be made by `kvpoolctl
// curve-keygen`, by zmq_curve_keypair or by pyzmq and handed around as text.
#pragma once

#include <string>
#include <vector>
#include <zmq.hpp>

#include "absl/status/statusor.h"

namespace kvp {

struct CurveKeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

// What a client needs to talk to a CURVE endpoint.
struct CurveClientKeys {
  std::string server_public_key;  // Z85: kvpoold's
  CurveKeyPair own;
};

absl::StatusOr<CurveKeyPair> NewCurveKeyPair();
// The 32 bytes of a Z85 key; INVALID_ARGUMENT (without the key's text) otherwise.
absl::StatusOr<std::string> DecodeZ85Key(absl::string_view text);
// INVALID_ARGUMENT unless `secret_key` is a Z85 key.
absl::StatusOr<CurveKeyPair> CurveKeyPairFromSecret(const std::string& secret_key);

// The one key in `path` (surrounding blank lines and comments allowed). NOT_FOUND for a missing
// file, INVALID_ARGUMENT naming the file for anything but exactly one Z85 key.
absl::StatusOr<std::string> ReadCurveKeyFile(const std::string& path);
// The keys of a key file's text, one per line; blank lines and lines starting with '#' are
// skipped ('#' is a Z85 character, so a comment cannot follow a key on its line). INVALID_ARGUMENT
// naming `path`:line (never the key's text) for a line that is not a Z85 key.
absl::StatusOr<std::vector<std::string>> ParseCurveKeyLines(absl::string_view text,
                                                            absl::string_view path);
// Every key in `path`, one per line, as 32 raw bytes each (what ZAP requests carry).
absl::StatusOr<std::vector<std::string>> ReadCurveKeyListFile(const std::string& path);
// Writes `key` and a newline to a new file of mode `mode`; ALREADY_EXISTS rather than overwrite.
absl::Status WriteCurveKeyFile(const std::string& path, const std::string& key, int mode);

// Makes `socket` a CURVE client of the server whose public key `keys` holds. Call before connect.
void UseCurveClientKeys(zmq::socket_t& socket, const CurveClientKeys& keys);

}  // namespace kvp
