#include "daemon/crash_points.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvp {

absl::StatusOr<CrashPoint> CrashPoint::Parse(absl::string_view spec) {
  CrashPoint point;
  if (spec.empty()) return point;
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int64_t n = 0;
  if (parts.size() != 3 || (parts[0] != "receive" && parts[0] != "log" && parts[0] != "send") ||
      parts[1].empty() || !absl::SimpleAtoi(parts[2], &n) || n < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--crash_at=", spec, ": expected STEP:KIND:N, STEP one of receive, log, send, N >= 1"));
  }
  point.step_ = parts[0];
  point.kind_ = parts[1];
  point.remaining_ = n;
  return point;
}

void CrashPoint::Reached(absl::string_view step, absl::string_view kind) {
  if (remaining_ == 0 || step != step_ || (kind_ != "*" && kind != kind_)) return;
  if (--remaining_ > 0) return;
  spdlog::warn("crash point {}:{} reached: SIGKILL", step_, kind_);
  spdlog::default_logger()->flush();
  ::raise(SIGKILL);
}

}  // namespace kvp
