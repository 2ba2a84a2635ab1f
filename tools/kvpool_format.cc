// kvpool-format: the cache's byte formats as a command, for checking compatibility with other
// implementations.
//
//   kvpool-format encode --format=F --head-dim=D [--scale=S] [--no-rotation] [--no-ue8m0] IN OUT
//   kvpool-format decode (same options) IN OUT
//   kvpool-format stats  (same options) IN
//   kvpool-format encode|decode|stats --format=fp8_ds_mla IN [OUT]
//
// IN of encode and stats holds N vectors of D little-endian float32 values; OUT of encode holds
// the bytes those N tokens (one head) occupy in the cache: data rows, then scale rows. For
// fp8_ds_mla (the MLA latent cache, kvpool/format/mla_latent.h) IN holds N tokens of 576 float32
// (512 latent, then 64 RoPE) and OUT N × 656 bytes.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvpool/format/kv_format_names.h"
#include "kvpool/format/mla_codec.h"
#include "kvpool/format/mla_latent.h"
#include "kvpool/format/section_codec.h"
#include "tools/file_io.h"

namespace kvp {
namespace {

constexpr char kUsage[] =
    "usage: kvpool-format encode|decode|stats --format=F --head-dim=D [options] IN [OUT]\n"
    "\n"
    "  encode IN OUT   IN: N x D little-endian float32; OUT: the cache bytes of those N tokens\n"
    "  decode IN OUT   the inverse: cache bytes back to N x D float32\n"
    "  stats IN        relative MSE and SNR of an encode/decode round trip of IN\n"
    "\n"
    "  --format=F      bf16 | fp8_e4m3 | turbo2 | turbo3 | turbo4 | indexer | fp8_ds_mla\n"
    "  --head-dim=D    64, 128 or 256 (indexer: 128; fp8_ds_mla: none, tokens of 576)\n"
    "  --scale=S       k_scale for fp8_e4m3, v_scale for turboN (default 1)\n"
    "  --no-rotation   turboN without the Walsh-Hadamard rotation\n"
    "  --no-ue8m0      indexer scales not rounded to powers of two\n"
    "\n"
    "Byte layout of OUT: fp8_e4m3 N*D bytes; bf16 N*D*2; turboN N*D*N/8 data bytes then N*D/16\n"
    "E4M3 scale bytes; indexer N*128 E4M3 bytes then N float32 scales; fp8_ds_mla N*656 bytes,\n"
    "each token 512 E4M3 latent values, 4 float32 tile scales, 64 bf16 RoPE values.\n";

struct Command {
  std::string verb;
  SectionCodecOptions options;
  bool mla = false;  // --format=fp8_ds_mla: whole tokens, not head vectors
  std::vector<std::string> files;
};

absl::StatusOr<Command> ParseArgs(int argc, char** argv) {
  if (argc < 2) return absl::InvalidArgumentError("missing command");
  Command cmd;
  cmd.verb = argv[1];
  if (cmd.verb != "encode" && cmd.verb != "decode" && cmd.verb != "stats") {
    return absl::InvalidArgumentError(absl::StrCat("unknown command '", cmd.verb, "'"));
  }
  bool have_format = false, have_dim = false;
  for (int i = 2; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--format=fp8_ds_mla") {
      cmd.mla = true;
      have_format = have_dim = true;
    } else if (absl::StartsWith(arg, "--format=")) {
      ASSIGN_OR_RETURN(cmd.options.format, ParseKvFormat(arg.substr(9)));
      have_format = true;
    } else if (absl::StartsWith(arg, "--head-dim=")) {
      if (!absl::SimpleAtoi(arg.substr(11), &cmd.options.head_dim)) {
        return absl::InvalidArgumentError(absl::StrCat("bad head dim in ", arg));
      }
      have_dim = true;
    } else if (absl::StartsWith(arg, "--scale=")) {
      if (!absl::SimpleAtof(arg.substr(8), &cmd.options.scale)) {
        return absl::InvalidArgumentError(absl::StrCat("bad scale in ", arg));
      }
    } else if (arg == "--no-rotation") {
      cmd.options.rotation = false;
    } else if (arg == "--no-ue8m0") {
      cmd.options.ue8m0 = false;
    } else if (absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", arg));
    } else {
      cmd.files.emplace_back(arg);
    }
  }
  if (!have_format) return absl::InvalidArgumentError("--format is required");
  if (!have_dim) return absl::InvalidArgumentError("--head-dim is required");
  const size_t want = cmd.verb == "stats" ? 1 : 2;
  if (cmd.files.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(cmd.verb, " takes ", want,
                                                   want == 1 ? " file" : " files (IN OUT)",
                                                   ", got ", cmd.files.size()));
  }
  if (!cmd.mla) RETURN_IF_ERROR(ValidateSectionCodecOptions(cmd.options));
  return cmd;
}

absl::StatusOr<std::vector<float>> ReadFloats(const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadFileBytes(path));
  if (bytes.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has ", bytes.size(), " bytes, not a whole number of float32 values"));
  }
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());  // little-endian host
  return values;
}

// `result` with the input file named in its error, so the user knows which file was wrong.
template <typename T>
absl::StatusOr<T> InFile(const std::string& path, absl::StatusOr<T> result) {
  if (result.ok()) return result;
  return absl::Status(result.status().code(), absl::StrCat(path, ": ", result.status().message()));
}

absl::Status RunMla(const Command& cmd) {
  if (cmd.verb == "encode") {
    ASSIGN_OR_RETURN(const std::vector<float> values, ReadFloats(cmd.files[0]));
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, InFile(cmd.files[0], EncodeMlaTokens(values)));
    return WriteFileAtomically(cmd.files[1], bytes);
  }
  if (cmd.verb == "decode") {
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadFileBytes(cmd.files[0]));
    ASSIGN_OR_RETURN(const std::vector<float> values, InFile(cmd.files[0], DecodeMlaTokens(bytes)));
    return WriteFileAtomically(cmd.files[1],
                               absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                                                   values.size() * sizeof(float)));
  }
  ASSIGN_OR_RETURN(const std::vector<float> values, ReadFloats(cmd.files[0]));
  ASSIGN_OR_RETURN(const RoundTripStats stats, InFile(cmd.files[0], MeasureMlaRoundTrip(values)));
  std::printf("format            fp8_ds_mla\n");
  std::printf("tokens            %lld\n", static_cast<long long>(stats.vectors));
  std::printf("bytes_per_token   %lld (bf16: %d)\n", static_cast<long long>(stats.bytes_per_vector),
              2 * kMlaInputDim);
  std::printf("relative_mse      %.6g\n", stats.relative_mse);
  std::printf("snr_db            %.2f\n", stats.snr_db);
  std::printf("max_abs_error     %.6g\n", stats.max_abs_error);
  return absl::OkStatus();
}

absl::Status Run(const Command& cmd) {
  if (cmd.mla) return RunMla(cmd);
  const SectionCodecOptions& o = cmd.options;
  if (cmd.verb == "encode") {
    ASSIGN_OR_RETURN(const std::vector<float> values, ReadFloats(cmd.files[0]));
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes,
                     InFile(cmd.files[0], EncodeSections(o, values)));
    return WriteFileAtomically(cmd.files[1], bytes);
  }
  if (cmd.verb == "decode") {
    ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadFileBytes(cmd.files[0]));
    ASSIGN_OR_RETURN(const std::vector<float> values,
                     InFile(cmd.files[0], DecodeSections(o, bytes)));
    return WriteFileAtomically(cmd.files[1],
                               absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()),
                                                   values.size() * sizeof(float)));
  }
  ASSIGN_OR_RETURN(const std::vector<float> values, ReadFloats(cmd.files[0]));
  ASSIGN_OR_RETURN(const RoundTripStats stats, InFile(cmd.files[0], MeasureRoundTrip(o, values)));
  std::printf("format            %s\n", std::string(KvFormatName(o.format)).c_str());
  std::printf("head_dim          %d\n", o.head_dim);
  std::printf("vectors           %lld\n", static_cast<long long>(stats.vectors));
  std::printf("bytes_per_vector  %lld (bf16: %d)\n", static_cast<long long>(stats.bytes_per_vector),
              2 * o.head_dim);
  std::printf("relative_mse      %.6g\n", stats.relative_mse);
  std::printf("snr_db            %.2f\n", stats.snr_db);
  std::printf("max_abs_error     %.6g\n", stats.max_abs_error);
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(kvp::kUsage, stdout);
    return 0;
  }
  absl::StatusOr<kvp::Command> cmd = kvp::ParseArgs(argc, argv);
  if (!cmd.ok()) {
    std::fprintf(stderr, "kvpool-format: %s\n\n%s", std::string(cmd.status().message()).c_str(),
                 kvp::kUsage);
    return 2;
  }
  const absl::Status status = kvp::Run(*cmd);
  if (!status.ok()) {
    std::fprintf(stderr, "kvpool-format: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
