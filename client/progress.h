// A progress bar on stderr for long client commands: redrawn in place on a terminal, a line per
// tenth otherwise (logs stay readable).
#pragma once

#include <cstdint>
#include <string>

namespace kvp {

class ProgressBar {
 public:
  ProgressBar();
  // Shows `phase` at done / total; a new phase starts a new bar.
  void Update(const std::string& phase, int64_t done, int64_t total);

 private:
  bool tty_;
  std::string phase_;
  int last_tenth_ = -1;
};

}  // namespace kvp
