#include "base/flag_file.h"

#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/bounded_file.h"

namespace kvp {
namespace {

constexpr absl::string_view kFlagFilePrefix = "--flagfile=";

bool IsFlagName(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

absl::Status Expand(absl::string_view arg, int depth, std::vector<std::string>& chain,
                    std::vector<std::string>& out) {
  if (!absl::StartsWith(arg, kFlagFilePrefix)) {
    out.emplace_back(arg);
    return absl::OkStatus();
  }
  const std::string path(arg.substr(kFlagFilePrefix.size()));
  if (depth > kMaxFlagFileDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag file ", path, " is nested more than ", kMaxFlagFileDepth, " deep"));
  }
  for (const std::string& outer : chain) {
    if (outer == path) {
      return absl::InvalidArgumentError(absl::StrCat("flag file ", path, " includes itself"));
    }
  }
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxFlagFileBytes, "flag file");
  if (!text.ok()) return text.status();
  absl::StatusOr<std::vector<std::string>> flags = ParseFlagFileText(*text, path);
  if (!flags.ok()) return flags.status();
  chain.push_back(path);
  for (const std::string& flag : *flags) {
    if (absl::Status s = Expand(flag, depth + 1, chain, out); !s.ok()) return s;
  }
  chain.pop_back();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseFlagFileText(absl::string_view text,
                                                           absl::string_view path) {
  if (text.size() > kMaxFlagFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag file ", path, " is over ", kMaxFlagFileBytes, " bytes"));
  }
  std::vector<std::string> flags;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view flag = absl::StripAsciiWhitespace(line);
    if (flag.empty() || flag.front() == '#') continue;
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", why));
    };
    if (flag.find('\0') != absl::string_view::npos) return bad("a NUL byte");
    if (!absl::StartsWith(flag, "--")) return bad("expected --name or --name=value");
    const absl::string_view name =
        flag.substr(2, flag.find('=') == absl::string_view::npos ? absl::string_view::npos
                                                                 : flag.find('=') - 2);
    if (!IsFlagName(name)) return bad("a flag name is letters, digits and '_'");
    flags.emplace_back(flag);
  }
  return flags;
}

absl::StatusOr<std::vector<std::string>> ExpandFlagFiles(int argc, char** argv) {
  std::vector<std::string> out;
  std::vector<std::string> chain;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i == 0) {
      out.push_back(std::move(arg));
      continue;
    }
    if ((arg == "--flagfile" || arg == "-flagfile") && i + 1 < argc) {
      arg = absl::StrCat(kFlagFilePrefix, argv[++i]);
    } else if (absl::StartsWith(arg, "-flagfile=")) {
      arg = absl::StrCat("-", arg);
    }
    if (absl::Status s = Expand(arg, 1, chain, out); !s.ok()) return s;
  }
  return out;
}

absl::StatusOr<std::vector<char*>> ParseCommandLineWithFlagFiles(
    int argc, char** argv, std::vector<std::string>& storage) {
  absl::StatusOr<std::vector<std::string>> args = ExpandFlagFiles(argc, argv);
  if (!args.ok()) return args.status();
  storage = *std::move(args);
  std::vector<char*> expanded;
  for (std::string& a : storage) expanded.push_back(a.data());
  // Flag files are expanded already; what Abseil sees is plain flags.
  return absl::ParseCommandLine(static_cast<int>(expanded.size()), expanded.data());
}

}  // namespace kvp
