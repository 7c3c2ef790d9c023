// options.hpp — defines: Options (what dtl-grade was asked to do).
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace dtl::grade {

struct Options {
  std::string source = ".";
  std::string build = "build";
  std::vector<std::string> labs;
  std::string side = "student";
  std::string json_path = "results.json";
  std::string build_logs;  // directory with labNN.log build logs from ./lab grade
  std::string run_as;      // drop to this user for student code (when grading as root)
  int timeout = 300;       // per mpirun
  int test_timeout = 60;   // per test (the harness watchdog), before scaling (see Grader)
  int perf_rounds = 3;
  int perf_max_rounds = 7;  // rounds a result just under the bar may take before it counts
  bool perf = true;
  int max_world = 0;        // grade only world sizes up to this (0: all); quick regrades, self-test
  std::string only_groups;  // grade only test groups whose name contains this
  std::vector<std::string> notes;  // lines for the top of the report (e.g. ignored files)
  bool audit = true;               // the static audit of student objects and sources
  std::string reference_times;     // JSON {lab: seconds, "tests": {...}}: written with --side
                                   // reference, read with --side student (budgets, watchdogs)
  double budget_min = 240;         // a lab's time budget: max(this, 5 x the reference's time)
  int output_limit_mb = 64;        // output of a student run
  int disk_limit_mb = 4096;        // what a student run's job directory may hold
  int memory_limit_mb = 6144;      // RLIMIT_DATA per process of student runs
  bool all = false;                // grade untouched skeletons too (else: "not started")
  std::string verdict = "auto";    // driver | in-process | auto (driver when a reference exists)
  bool sandbox = true;             // student runs inside dtl-sandbox
};

// DTL_GRADE_KEEP=1: keep every job's directory (worker and driver reports, observations, the
// ranks' files) for an instructor who wants to see why a job ended the way it did.
inline bool keep_job_dirs() {
  const char* keep = std::getenv("DTL_GRADE_KEEP");
  return keep && *keep && *keep != '0';
}

}  // namespace dtl::grade
