// jobs.hpp — defines: JobPlan, Job, JobRunner.
//
// Stage 4 of grading, the sandboxed run. One job = one test binary at one world size with one
// gtest filter. For a student's code it is two runs (dtl/harness/observe.hpp):
//   worker  mpirun -n N dtl-sandbox <policy> -- labNN_X_student --dtl_record=JOB ...
//           as the student's user, in a PID namespace of its own, with output, file, memory and
//           disk limits; its directory JOB is the only place it may write;
//   driver  mpirun -n N labNN_X_reference --dtl_check=JOB --gtest_output=json:TRUSTED/...
//           as the grader, reading the worker's observations; its report, in a directory the
//           worker cannot reach, is the verdict.
// Both get the same DTL_SEED, drawn from the operating system per job. When the worker's own
// report shows no passing test, its failures are the verdict (a forged failure only costs its
// author) and the driver is not run. The reference's own grading (--solutions) and a student
// release without references run one in-process job, as before.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "options.hpp"
#include "run.hpp"
#include "tools.hpp"

namespace dtl::grade {

struct JobPlan {
  std::string worker;  // the binary that runs the code under test
  std::string driver;  // the trusted binary that checks it; empty: in-process verdict
  std::string filter;  // gtest filter
  int world = 1;
  int timeout = 300;       // seconds, each of worker and driver
  int test_timeout = 60;   // the harness watchdog, per test
  bool untrusted = false;  // the worker runs student code (identity, namespace, limits, sandbox)
  bool processes = false;  // the sandbox lets the tests start jobs of their own (labs 17, 18)
};

struct Job {
  RunResult worker, driver;
  bool split = false;  // the verdict came from the driver
  bool driver_ran = false;
  int timeout = 0;
  nlohmann::json report;    // the verdict's gtest report (driver's, or the in-process run's)
  nlohmann::json watchdog;  // the worker's watchdog findings, if it fired
  nlohmann::json summary;   // the driver's observation counts per test
  std::map<std::string, std::string> failed;  // test -> its failure messages, once each
  std::set<std::string> passed, skipped;
  // Set when what was left of the lab's time budget set this job's limit: "time budget of 10 s
  // for lab 03 used up (...)", added to the reason of a run that limit, or a watchdog it
  // shortened (watchdog_cut_by_budget), stopped.
  std::string budget_note;
  bool watchdog_cut_by_budget = false;
  // Whether the run that decides ended by itself (see Grader::trusted).
  const RunResult& deciding() const { return split ? driver : worker; }
};

class JobRunner {
 public:
  // `reports`: a directory only the grader can write; `libraries`: the shared libraries the
  // tests load (their directories become readable inside the sandbox).
  JobRunner(const Options& opt, const Identity& student, std::string reports,
            std::vector<std::string> libraries);
  Job run(const JobPlan& plan);
  // The worker's sandbox command prefix for a benchmark or other student program (each rank).
  std::vector<std::string> sandbox_prefix(const std::string& job_dir, bool processes) const;
  // The prefix that puts mpirun itself in a sandbox (before mpirun's own arguments): it may
  // start only its own programs, the per-rank launcher and `program` (MPI_Comm_spawn of anything
  // else fails), and writes only where the ranks may.
  std::vector<std::string> launcher_prefix(const std::string& job_dir,
                                           const std::string& program) const;
  // mpirun and its flags; `sandboxed`: named by path, for launcher_prefix.
  std::vector<std::string> mpirun(int n, bool sandboxed = false) const;
  std::vector<std::string> mpi_env() const;
  Limits student_limits(const std::string& job_dir) const;
  Launch student_launch() const;
  // A fresh directory for one student run, writable by the student's user.
  std::string job_dir();
  const std::string& reports() const { return reports_; }
  void set_libraries(std::vector<std::string> libraries) { libraries_ = std::move(libraries); }

 private:
  void read_report(const std::string& path, Job& job) const;
  std::vector<std::string> policy_args(const std::string& job_dir) const;
  const Options& opt_;
  Identity student_;
  std::string reports_;
  std::vector<std::string> libraries_;
  int counter_ = 0;
};

// One of every failure message, without the per-rank repetitions ("[rank r/n] ..." copies of
// the same failure on other ranks) and ANSI colour codes; at most `max` characters.
std::string failure_text(const nlohmann::json& failures, size_t max = 4000);

}  // namespace dtl::grade
