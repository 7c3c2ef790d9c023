// dtl/harness/jobs.hpp — defines: JobResult, run_mpi_job, run_job, DTL_JOB, job_arg.
//
// Fault tests need new processes: a rank killed with SIGKILL, a job that aborts, a restart that
// must resume from disk. None of that can happen inside the test's own job (mpirun would end
// it), so such a test launches a child job of its own and judges how it ended:
//
//   DTL_JOB(train) {                       // in a test source: a job body, run by every rank
//     dtl::Comm& world = dtl::world();     // the child's Runtime exists already
//     int steps = std::stoi(dtl::testing::job_arg(args, "steps", "4"));
//     ...
//     return 0;                            // the rank's exit code
//   }
//
//   TEST(Faults, KilledRankLeavesTheOldCheckpoint) {
//     auto r = dtl::testing::run_job("train", 2, {"steps=6", "dir=" + dir}, 60);
//     EXPECT_EQ(r.signal, 9) << r.describe();
//   }
//
// run_job starts `mpirun -n RANKS <this test binary> --dtl_job=train --dtl_timeout=T args...`
// (the harness's mpirun flags and environment, minus the variables that tie a process to the
// job it runs in), waits at most `timeout_s` (then SIGTERM to mpirun, which ends its ranks, and
// SIGKILL after 3 s), and returns its exit status and output. The child's harness watchdog gets
// the same timeout, so a hang in the child ends in the usual diagnosis, printed in its output.
// The child stays in the caller's process group: whatever kills the test kills it too.
#pragma once

#include <string>
#include <vector>

namespace dtl::testing {

struct JobResult {
  int exit_code = -1;     // mpirun's exit code (-1 when it ended on a signal)
  int signal = 0;         // the signal that ended mpirun, or the one that ended a rank (mpirun
                          // exits 128 + signal when a rank is killed: 137 for SIGKILL)
  bool timed_out = false;
  double seconds = 0;     // wall time from launch to the end
  std::string output;     // stdout and stderr of every rank, interleaved as they came
  bool ok() const { return !timed_out && exit_code == 0; }
  // "exit 0 after 1.3 s" / "killed by signal 9 after 0.8 s" / "timed out after 60 s", plus the
  // last lines of output.
  std::string describe() const;
};

// Runs `mpirun -n ranks <flags> exe args...` as a new job and waits for it (see above).
JobResult run_mpi_job(int ranks, const std::string& exe, const std::vector<std::string>& args,
                      double timeout_s, const std::vector<std::string>& env = {});

// This binary as a child job running the DTL_JOB registered as `name`, with `args` (use
// "key=value" words; job_arg reads them) and env entries ("K=V") added to its environment.
JobResult run_job(const std::string& name, int ranks, const std::vector<std::string>& args,
                  double timeout_s, const std::vector<std::string>& env = {});

// Environment entries for run_job/run_mpi_job that let the other ranks of a job live on when one
// dies (a crash, SIGKILL), as the ranks on the other nodes of a cluster do until their own
// watchdog fires: a plain mpirun kills them the moment one rank dies. OpenMPI 4 (ORTE) reads
// orte_enable_recovery, OpenMPI 5 (PRRTE) state_base_recoverable (`mpirun --enable-recovery`).
inline const std::vector<std::string>& survivors_live_on_env() {
  static const std::vector<std::string> env = {"OMPI_MCA_orte_enable_recovery=1",
                                               "PRTE_MCA_state_base_recoverable=1"};
  return env;
}

// The path of the running executable (/proc/self/exe).
std::string self_exe();

// The value of "key=value" in a job's args, or `fallback`.
std::string job_arg(const std::vector<std::string>& args, const std::string& key,
                    const std::string& fallback = "");

using JobMain = int (*)(const std::vector<std::string>& args);
bool register_job(const char* name, JobMain fn);  // DTL_JOB's registration
JobMain find_job(const std::string& name);        // the test main's lookup; nullptr if none

}  // namespace dtl::testing

#define DTL_JOB(name)                                                                    \
  static int dtl_job_##name(const std::vector<std::string>& args);                       \
  [[maybe_unused]] static const bool dtl_job_registered_##name =                         \
      ::dtl::testing::register_job(#name, &dtl_job_##name);                              \
  static int dtl_job_##name([[maybe_unused]] const std::vector<std::string>& args)
