// Where kvpoold listens by default (docs/design.md §8): a runtime directory of mode 0700 holding
// the ZeroMQ socket and the fd channel. One place, so the daemon, workers and clients agree.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace kvp {

// $KVPOOL_RUNTIME_DIR, else systemd's $RUNTIME_DIRECTORY, else /run/kvpool for root, else
// $XDG_RUNTIME_DIR/kvpool, else /tmp/kvpool-<uid>.
std::string DefaultRuntimeDir();

std::string EndpointIn(const std::string& runtime_dir);   // ipc://<dir>/kvpoold.sock
// <dir>/kvpoold.fds for pool 0 (the only one of most kvpoolds), <dir>/kvpoold-<pool>.fds after.
std::string FdChannelIn(const std::string& runtime_dir, int pool = 0);
// <dir>/kvpoold-return.fds: where a restarting kvpoold that lacks its arena's chunks takes them
// back from workers (docs/design.md §10); it exists only while kvpoold waits for them.
std::string ReturnChannelIn(const std::string& runtime_dir);
// The return channel beside an fd channel (what a worker knows of kvpoold's runtime directory).
std::string ReturnChannelBeside(const std::string& fd_channel);

// Creates `dir` (and parents) if missing and makes it mode 0700 owned by us; FAILED_PRECONDITION
// when it exists and belongs to someone else.
absl::Status PrepareRuntimeDir(const std::string& dir);

}  // namespace kvp
