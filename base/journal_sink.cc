#include "base/journal_sink.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <syslog.h>
#include <systemd/sd-journal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "base/log_context.h"

namespace kvp {
namespace {

int SyslogPriority(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return LOG_DEBUG;
    case spdlog::level::info:
      return LOG_INFO;
    case spdlog::level::warn:
      return LOG_WARNING;
    case spdlog::level::err:
      return LOG_ERR;
    case spdlog::level::critical:
      return LOG_CRIT;
    default:
      return LOG_NOTICE;
  }
}

class JournalSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit JournalSink(std::string identifier) : identifier_(std::move(identifier)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string text(msg.payload.data(), msg.payload.size());
    const LogContext& context = current_log_context;
    if (context.request_id != 0 || !context.client.empty()) {
      sd_journal_send("MESSAGE=%s", text.c_str(), "PRIORITY=%d", SyslogPriority(msg.level),
                      "SYSLOG_IDENTIFIER=%s", identifier_.c_str(), "KVPOOL_REQUEST_ID=%llu",
                      static_cast<unsigned long long>(context.request_id), "KVPOOL_CLIENT=%s",
                      context.client.c_str(), nullptr);
    } else {
      sd_journal_send("MESSAGE=%s", text.c_str(), "PRIORITY=%d", SyslogPriority(msg.level),
                      "SYSLOG_IDENTIFIER=%s", identifier_.c_str(), nullptr);
    }
  }
  void flush_() override {}

 private:
  std::string identifier_;
};

}  // namespace

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0, inode = 0;
  if (std::sscanf(stream, "%llu:%llu", &device, &inode) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == device &&
         static_cast<unsigned long long>(st.st_ino) == inode;
}

void InstallLogger(const std::string& identifier) {
  if (StderrIsJournal()) {
    auto logger = std::make_shared<spdlog::logger>(identifier, std::make_shared<JournalSink>(identifier));
    spdlog::set_default_logger(std::move(logger));
    return;
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ " + identifier + "[%P] %v");
}

}  // namespace kvp
