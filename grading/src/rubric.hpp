// rubric.hpp — defines: Rubric, TestGroup, PerfCheck, load_rubrics, filter_matches.
// The format is documented in labs/README.md ("rubric.json").
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

struct TestGroup {
  std::string name;
  std::string binary;  // "test" (public) or "grade" (grading-only)
  std::string filter;  // gtest filter
  std::vector<int> world_sizes;
  // The share of `points` each world size carries, in the order of world_sizes (default: equal).
  // A collective is the identity at one rank, where doing nothing passes: its n=1 weighs little.
  std::vector<double> weights;
  double points = 0;
  // The points of this group's run at world size n.
  double points_at(int n) const;
  std::string visibility = "visible";
  int timeout = 0;  // seconds per run; 0 = the grader's default
};

struct PerfCheck {
  std::string name;
  int ranks = 2;
  std::string benchmark;  // Google Benchmark name prefix, e.g. "BM_Ring/16777216"
  std::string counter;    // a counter (e.g. busbw_GBps) or "real_time"
  bool higher_is_better = true;
  double min_ratio = 0.8;
  double points = 0;
  // The grader times the whole benchmark process at these two --benchmark_repetitions counts
  // (perf.hpp): the difference is the time of the extra repetitions.
  int repetitions_low = 1, repetitions_high = 4;
};

struct Rubric {
  std::string lab;                                   // "03"
  std::vector<std::string> audit_allow, audit_deny;  // "audit": extra symbol patterns (audit.hpp)
  double autograder_only_points = 0;  // a student release's rubric: the hidden tests' and
                                      // performance checks' points, graded by the course only
  std::string slug;                   // "03_ring_allreduce"
  std::string title;
  std::vector<std::string> student_files;
  std::vector<TestGroup> tests;
  std::vector<PerfCheck> performance;
  // "sandbox": {"processes": true}: the lab's tests start jobs of their own (fault injection),
  // so its student runs may create processes (sandbox.hpp).
  bool sandbox_processes = false;
  // "observed": true: every assertion of the lab's tests on a value of the student's code goes
  // through an observation (dtl/harness/observe.hpp), so the driver checks all of them; else some
  // are checked inside the student's process only, and the report says so.
  bool observed = false;
  double max_points() const;
};

// Every grading/NN_slug/rubric.json under `source_dir`, sorted by lab number; `only` (if not
// empty) keeps those lab numbers. Throws std::runtime_error naming the file and field on
// malformed rubrics.
std::vector<Rubric> load_rubrics(const std::string& source_dir,
                                 const std::vector<std::string>& only);

// Whether gtest's --gtest_filter=FILTER ("POS1:POS2-NEG1:NEG2", globs with * and ?) selects the
// test "Suite.Name": how the grader maps a binary's one test listing onto its rubric groups.
bool filter_matches(const std::string& filter, const std::string& name);

}  // namespace dtl::grade
