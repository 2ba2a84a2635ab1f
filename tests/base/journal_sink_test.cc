// Which log sink a process takes (base/journal_sink.h) and the request context its records carry
// (base/log_context.h).
#include "base/journal_sink.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "base/log_context.h"
#include "gtest/gtest.h"

namespace kvp {
namespace {

std::string StreamOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

TEST(JournalSinkTest, StderrIsTheJournalOnlyWhenJournalStreamNamesIt) {
  ::unsetenv("JOURNAL_STREAM");
  EXPECT_FALSE(StderrIsJournal());
  ::setenv("JOURNAL_STREAM", StreamOf(STDERR_FILENO).c_str(), 1);
  EXPECT_TRUE(StderrIsJournal());
  // systemd sets it for the service; a child whose stderr was redirected inherits it but must
  // not write to the journal instead of its file.
  ::setenv("JOURNAL_STREAM", "1:2", 1);
  EXPECT_FALSE(StderrIsJournal());
  ::setenv("JOURNAL_STREAM", "garbage", 1);
  EXPECT_FALSE(StderrIsJournal());
  ::unsetenv("JOURNAL_STREAM");
}

TEST(JournalSinkTest, ARequestsContextLastsItsScopeAndStaysOnItsThread) {
  EXPECT_EQ(current_log_context.request_id, 0u);
  {
    const ScopedLogContext outer(7, "engine-a");
    EXPECT_EQ(current_log_context.request_id, 7u);
    {
      const ScopedLogContext inner(9, "engine-b");
      EXPECT_EQ(current_log_context.client, "engine-b");
      std::thread([] { EXPECT_EQ(current_log_context.request_id, 0u); }).join();
    }
    EXPECT_EQ(current_log_context.request_id, 7u);
    EXPECT_EQ(current_log_context.client, "engine-a");
  }
  EXPECT_EQ(current_log_context.request_id, 0u);
  EXPECT_TRUE(current_log_context.client.empty());
}

}  // namespace
}  // namespace kvp
