// run.hpp — defines: RunResult, run_command (a child process group with a timeout).
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

struct RunResult {
  int exit_code = -1;     // exit status, or -1 when killed or signalled
  int signal = 0;         // terminating signal, if any
  bool timed_out = false;
  bool output_limited = false;  // stopped because its output reached Limits::file_bytes
  double seconds = 0;
  std::string output;     // stdout + stderr (the tail, if long)
};

// Resource limits for a child and everything it starts (0: none).
struct Limits {
  long long file_bytes = 0;  // RLIMIT_FSIZE: largest file it may write; also the cap on its
                             // output, which mpirun forwards from the ranks' pipes (no rlimit
                             // there): the job is stopped when the output reaches it
  long long data_bytes = 0;  // RLIMIT_DATA: heap and private mappings per process
};

// Runs argv in a new process group with stdout and stderr captured, in `cwd` if not empty.
// On timeout the whole group (mpirun and every rank) gets SIGTERM, then SIGKILL 3 s later.
// `env` entries ("K=V") are added to the environment.
RunResult run_command(const std::vector<std::string>& argv, int timeout_seconds,
                      const std::vector<std::string>& env = {}, const std::string& cwd = "",
                      const Limits& limits = {});

// Kills every process of user `uid` (a daemon that escaped the process group with setsid):
// a child takes that uid and signals all it may signal. Needs root; returns false otherwise.
bool kill_user_processes(int uid, int gid);

// Makes this process the "subreaper" of everything it starts (Linux prctl): a process that
// escapes its parent and session (setsid, double fork) is re-parented to the grader instead of
// init, so it can still be found and killed.
void adopt_orphans();
// Kills every child of this process and, as they are re-parented here, theirs: what a student
// command left behind after it ended (a daemon). Call it when no command of the grader's own is
// running. Returns how many processes it killed.
int kill_descendants();

// Output of a trusted command (nm, ldd), all of it; throws if it cannot run.
std::string capture(const std::string& shell_command);

// The last `lines` lines of text.
std::string tail(const std::string& text, int lines);

}  // namespace dtl::grade
