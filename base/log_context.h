// The request a thread is handling, for structured log fields (base/journal_sink.h): set for the
// duration of a handler by ScopedLogContext, read by the log sink. Thread-local, so concurrent
// handlers (and the HTTP thread) never see each other's.
#pragma once

#include <cstdint>
#include <string>

namespace kvp {

struct LogContext {
  uint64_t request_id = 0;  // 0: none
  std::string client;       // the peer's identity; empty: none
};

inline thread_local LogContext current_log_context;

class ScopedLogContext {
 public:
  ScopedLogContext(uint64_t request_id, std::string client) : saved_(current_log_context) {
    current_log_context = LogContext{request_id, std::move(client)};
  }
  ~ScopedLogContext() { current_log_context = std::move(saved_); }
  ScopedLogContext(const ScopedLogContext&) = delete;
  ScopedLogContext& operator=(const ScopedLogContext&) = delete;

 private:
  LogContext saved_;
};

}  // namespace kvp
