// Fuzz target: any bytes as a flag file (first byte even) or a CURVE key file (odd). Findings: a
// crash, or a line accepted that is not a flag or a key.
#include "base/flag_file.h"
#include "protocol/curve.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvp;
  fuzz::FuzzInput in(data, size);
  const bool flags = in.Byte() % 2 == 0;
  const std::string text = in.Rest();
  if (flags) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseFlagFileText(text, "fuzz.flags");
    if (!parsed.ok()) return 0;
    for (const std::string& f : *parsed) {
      if (f.size() < 3 || f[0] != '-' || f[1] != '-' || f.find('\n') != std::string::npos) {
        fuzz::CheckOrDie(absl::InternalError(f), "accepted a line that is no flag");
      }
    }
  } else {
    absl::StatusOr<std::vector<std::string>> keys = ParseCurveKeyLines(text, "fuzz.keys");
    if (!keys.ok()) return 0;
    for (const std::string& k : *keys) {
      if (k.size() != 40)
        fuzz::CheckOrDie(absl::InternalError(k), "accepted a line that is no key");
    }
  }
  return 0;
}
