// results.hpp — defines: GroupRun, PerfResult, LabResult (what grading one lab produced), and
// small text helpers shared by the stages.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "rubric.hpp"

namespace dtl::grade {

struct GroupRun {
  const TestGroup* group = nullptr;
  int world = 1;
  int passed = 0, total = 0;
  double score = 0, max_score = 0;
  std::string reason;            // empty when all passed
  std::string output;            // the failures of this group's tests, each once
  bool not_implemented = false;  // every test that ran failed with "not implemented"
  bool hung = false;             // a test of this group was the one the watchdog stopped
  bool stalled = false;          // its run hung (watchdog or time limit): larger sizes not run
};

struct PerfResult {
  const PerfCheck* check = nullptr;
  double student = NAN, reference = NAN, ratio = NAN, score = 0;
  bool unmeasured = false;  // the machine was too noisy to decide: no points given or taken
                            // (the check's maximum is 0 in this result), flagged
  std::string reason, output;
};

struct LabResult {
  const Rubric* rubric = nullptr;
  std::string audit_output;            // what the audit rejected, if anything
  std::vector<std::string> integrity;  // what it noticed but the sandbox made harmless
  std::string verdict;                 // how the verdict was reached, one line for the table
  std::vector<GroupRun> runs;
  std::vector<PerfResult> perf;
  std::string reason;
  bool not_started = false;  // the untouched skeleton: nothing was run
  int pairs_passed = 0, pairs_total = 0;
  double correctness = 0, correctness_max = 0, performance = 0, performance_max = 0;
};

// The first line of s, at most `max` characters.
std::string first_line(const std::string& s, size_t max = 200);
// The whole message on one line (runs of white space made one space), at most `max` characters.
std::string gist(const std::string& s, size_t max = 300);
// mpirun's line about a rank that a signal ended ("mpirun noticed that process rank 1 with PID
// ... exited on signal 11 (Segmentation fault)."), on one line; "" when there is none. OpenMPI 5
// (prterun) wraps that sentence after "exited on".
std::string signal_death_line(const std::string& output);
// "not implemented: lab 03: ring_all_reduce (ring_allreduce.cpp:41)" -> "not implemented: lab
// 03: ring_all_reduce"; "" when msg is not a not-implemented failure.
std::string not_implemented_reason(const std::string& msg);
// Text for a student's screen or Gradescope: ANSI colour codes removed.
std::string plain(const std::string& text);

}  // namespace dtl::grade
