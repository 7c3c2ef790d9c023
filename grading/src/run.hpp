// run.hpp — defines: RunResult, run_command (a child process group with a timeout).
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

struct RunResult {
  int exit_code = -1;     // exit status, or -1 when killed or signalled
  int signal = 0;         // terminating signal, if any
  bool timed_out = false;
  double seconds = 0;
  std::string output;     // stdout + stderr (the tail, if long)
};

// Runs argv in a new process group with stdout and stderr captured, in `cwd` if not empty.
// On timeout the whole group (mpirun and every rank) gets SIGTERM, then SIGKILL 3 s later.
// `env` entries ("K=V") are added to the environment.
RunResult run_command(const std::vector<std::string>& argv, int timeout_seconds,
                      const std::vector<std::string>& env = {}, const std::string& cwd = "");

// The last `lines` lines of text.
std::string tail(const std::string& text, int lines);

}  // namespace dtl::grade
