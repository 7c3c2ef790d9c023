// run.hpp — defines: RunResult, Limits, Launch, run_command, adopt_orphans, kill_descendants,
// tail.
//
// Child processes with a hard timeout: nothing a student's code does can hang the grader or
// outlive its job. A job that runs student code runs in a PID namespace of its own (as root, as
// on Gradescope; as an ordinary user inside a user namespace of its own, mapped to that user
// alone, where the kernel allows it): when its first process (mpirun) ends, the kernel ends every
// other process in it, a `setsid` daemon included, and graders running side by side never touch
// each other's processes. It also gets a mount namespace of its own: a fresh /proc that lists
// only the job's processes (not other gradings' command lines and directories), and an empty
// /dev/shm that ends with the job (where NCCL keeps its shared memory within a node; the sandbox
// may then let the job write there without reaching anyone else's). Where no namespace can be
// made (unprivileged user namespaces forbidden), the grader is the subreaper of what it starts
// and kills its own descendants after each job.
#pragma once

#include <string>
#include <vector>

#include "tools.hpp"

namespace dtl::grade {

struct RunResult {
  int exit_code = -1;  // exit status, or -1 when killed or signalled
  int signal = 0;      // terminating signal, if any
  bool timed_out = false;
  bool output_limited = false;  // stopped because its output reached Limits::output_bytes
  bool disk_limited = false;    // stopped because Limits::watch_dir grew past Limits::dir_bytes
  double seconds = 0;
  std::string output;  // stdout + stderr (the tail, if long)
};

// Resource limits for a child and everything it starts (0: none).
struct Limits {
  long long output_bytes = 0;  // the job is stopped when its output reaches this (mpirun forwards
                               // the ranks' output, so no rlimit can cap it)
  long long file_bytes = 0;    // RLIMIT_FSIZE: largest file any process may write
  long long data_bytes = 0;    // RLIMIT_DATA: heap and private mappings per process
  std::string watch_dir;       // the job's directory ...
  long long dir_bytes = 0;     // ... may hold at most this much (checked about once a second)
};

struct Launch {
  Identity as;                     // drop to this user (needs root)
  bool own_pid_namespace = false;  // a PID namespace for the job (where one can be made; else
                                   // ignored), with a mount namespace: its own /proc and /dev/shm
  long long shm_bytes = 1LL << 30;   // the size of the job's own /dev/shm
};

// Runs argv in a new process group with stdout and stderr captured, in `cwd` if not empty.
// On timeout the whole group (mpirun and every rank) gets SIGTERM, then SIGKILL 3 s later.
// `env` entries ("K=V") are added to the environment.
RunResult run_command(const std::vector<std::string>& argv, int timeout_seconds,
                      const std::vector<std::string>& env = {}, const std::string& cwd = "",
                      const Limits& limits = {}, const Launch& launch = {});

// Whether this process may give jobs PID namespaces of their own (root, or an ordinary user
// through a user namespace, where the kernel allows it: tried once).
bool pid_namespaces_available();

// Whether those jobs also get their own /proc and /dev/shm (a mount namespace: tried once).
bool private_mounts_available();

// Makes this process the "subreaper" of everything it starts (Linux prctl): a process that
// escapes its parent and session (setsid, double fork) is re-parented to the grader instead of
// init, so it can still be found and killed.
void adopt_orphans();
// Kills every child of this process and, as they are re-parented here, theirs: what a student
// command left behind after it ended (a daemon). Call it when no command of the grader's own is
// running. Returns how many processes it killed.
int kill_descendants();

// The last `lines` lines of text.
std::string tail(const std::string& text, int lines);

}  // namespace dtl::grade
