// What benchmark reports record about the run: the UTC date and the host name.
#pragma once

#include <unistd.h>

#include <ctime>
#include <string>

namespace kvp {

inline std::string TodayUtc() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

inline std::string Hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace kvp
