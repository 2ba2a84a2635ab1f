// Logs a journal can filter: under systemd (stderr connected to the journal, which systemd says
// in $JOURNAL_STREAM) each record goes through sd_journal_send with PRIORITY, SYSLOG_IDENTIFIER
// and, inside a request's handler, KVPOOL_REQUEST_ID and KVPOOL_CLIENT (base/log_context.h):
//   journalctl -u kvpoold KVPOOL_CLIENT=engine-7 -p warning
// Elsewhere one line per record on stderr, as before.
#pragma once

#include <string>

namespace kvp {

// True when stderr is the journal's stream (the device and inode $JOURNAL_STREAM names).
bool StderrIsJournal();

// Installs the default logger of a process called `identifier` (kvpoold, kvpool-worker): the
// journal sink when StderrIsJournal(), else stderr lines with this pattern's timestamp and pid.
void InstallLogger(const std::string& identifier);

}  // namespace kvp
