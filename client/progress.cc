#include "client/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kvp {

ProgressBar::ProgressBar() : tty_(::isatty(STDERR_FILENO) == 1) {}

void ProgressBar::Update(const std::string& phase, int64_t done, int64_t total) {
  if (phase != phase_) {
    phase_ = phase;
    last_tenth_ = -1;
  }
  const double fraction = total > 0 ? static_cast<double>(done) / total : 1.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%-8s [%.*s%*s] %lld/%lld", phase.c_str(), filled,
                 "##############################", kWidth - filled, "",
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done >= total) std::fputc('\n', stderr);
    return;
  }
  const int tenth = static_cast<int>(fraction * 10);
  if (tenth != last_tenth_) {
    last_tenth_ = tenth;
    std::fprintf(stderr, "%s: %lld/%lld\n", phase.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total));
  }
}

}  // namespace kvp
