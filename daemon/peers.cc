#include "daemon/peers.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/bounded_file.h"
#include "base/status_macros.h"
#include "protocol/curve.h"

namespace kvp {
namespace {

constexpr size_t kMaxPeersFileBytes = size_t{1} << 20;
constexpr size_t kMaxNodeNameChars = 63;

}  // namespace

absl::Status CheckNodeName(absl::string_view name) {
  const auto allowed = [](char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c); };
  bool valid = !name.empty() && name.size() <= kMaxNodeNameChars && allowed(name.front());
  for (char c : name) valid = valid && (allowed(c) || c == '-');
  if (!valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node name '", name, "': 1 to ", kMaxNodeNameChars,
        " lowercase letters, digits and '-', starting with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PeerNode>> ParsePeers(absl::string_view text, absl::string_view path,
                                                 absl::string_view own_name) {
  std::vector<PeerNode> peers;
  absl::flat_hash_set<std::string> names, endpoints, keys;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty() || stripped.front() == '#') continue;
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", why));
    };
    const std::vector<absl::string_view> fields =
        absl::StrSplit(stripped, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3) return bad("expected: NAME tcp://HOST:PORT PUBLIC_KEY");
    PeerNode peer{.name = std::string(fields[0]),
                  .endpoint = std::string(fields[1]),
                  .public_key = std::string(fields[2]),
                  .raw_key = ""};
    if (absl::Status name = CheckNodeName(peer.name); !name.ok()) return bad(name.message());
    if (peer.name == own_name) return bad(absl::StrCat("'", peer.name, "' is this node's name"));
    if (!absl::StartsWith(peer.endpoint, "tcp://") || peer.endpoint.size() <= 6) {
      return bad(absl::StrCat("endpoint ", peer.endpoint, ": expected tcp://HOST:PORT"));
    }
    absl::StatusOr<std::string> raw = DecodeZ85Key(peer.public_key);
    if (!raw.ok()) return bad(raw.status().message());
    peer.raw_key = *std::move(raw);
    if (!names.insert(peer.name).second) return bad(absl::StrCat("peer ", peer.name, " again"));
    if (!endpoints.insert(peer.endpoint).second) {
      return bad(absl::StrCat("endpoint ", peer.endpoint, " again"));
    }
    if (!keys.insert(peer.raw_key).second) return bad("a key listed for another peer");
    peers.push_back(std::move(peer));
  }
  return peers;
}

absl::StatusOr<std::vector<PeerNode>> ReadPeersFile(const std::string& path,
                                                    absl::string_view own_name) {
  ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, kMaxPeersFileBytes, "peers file"));
  return ParsePeers(text, path, own_name);
}

}  // namespace kvp
