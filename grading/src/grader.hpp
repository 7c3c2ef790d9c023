// grader.hpp — defines: Grader (grading one lab from its rubric, stage by stage).
//
// The stages, each in a file of its own:
//   intake.cpp   the submission's files into a scratch copy (./lab grade --submission)
//   audit.cpp    what the sources use and the objects call and define
//   (./lab)      the build
//   sandbox.cpp  the sandbox student processes run in; jobs.cpp the sandboxed run and the
//                driver that checks it
//   grader.cpp   the verdict: scores from the driver's report, per rubric group and world size
//   perf.cpp     performance, timed by the grader
//   report.cpp   the terminal table, results.json and the integrity report
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "audit.hpp"
#include "jobs.hpp"
#include "options.hpp"
#include "perf.hpp"
#include "results.hpp"
#include "rubric.hpp"
#include "sandbox.hpp"

namespace dtl::grade {

// The audit's policy for a lab and the student sources it checks.
AuditPolicy policy_for(const Rubric& r, const std::string& source, std::vector<std::string>& files);
// The compiled student files of lab r on `side` ("student" or "reference").
std::vector<std::string> lab_objects(const std::string& build, const Rubric& r,
                                     const std::string& side);

class Grader {
 public:
  explicit Grader(Options o);
  ~Grader();
  LabResult grade(const Rubric& r);
  void save_reference_times() const;
  // One line for the report: how verdicts were reached and what contained the student's code.
  std::string isolation() const;

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t);
  bool student() const { return opt_.side == "student"; }
  bool driver_for(const Rubric& r, const std::string& binary) const;
  void load_reference_times();
  GroupRun not_run(const TestGroup& g, int n, const std::string& reason, const std::string& output);
  std::string audit(const Rubric& r, LabResult& lab);
  std::pair<std::vector<std::string>, std::vector<std::string>> test_libraries(
      const Rubric& r) const;
  std::string bin(const Rubric& r, const std::string& kind, const std::string& side) const;
  std::string build_log(const Rubric& r) const;
  const std::vector<std::string>& listing(const std::string& exe);
  int test_timeout(const Rubric& r, const std::vector<std::string>& tests) const;
  Job run_job(const Rubric& r, const std::string& binary, const std::string& filter, int n,
              int timeout, const std::vector<std::string>& tests, bool budget_bound = false);
  static bool trusted(const Job& job, const std::vector<std::string>& expected);
  GroupRun score_group(const TestGroup& g, int n, const std::vector<std::string>& expected,
                       const Job& job);
  std::vector<GroupRun> run_groups(const Rubric& r, const std::string& binary,
                                   const std::vector<size_t>& groups, int n, double seconds_left);
  PerfResult skipped(const PerfCheck& c, const std::string& why);
  // "time budget of B s for lab NN used up (the reference needs R s)".
  std::string budget_used_up(const Rubric& r);
  void after_student_command();

  Options opt_;
  Identity student_;
  SandboxSupport sandbox_;
  bool namespaces_ = false;
  std::string reports_;
  std::unique_ptr<JobRunner> jobs_;
  std::unique_ptr<PerfRunner> perf_;
  double budget_ = -1;  // seconds for the lab being graded; -1: none
  std::map<std::string, double> reference_seconds_;
  std::map<std::string, double> reference_test_seconds_;      // "lab/Suite.Test" -> seconds
  std::map<std::string, std::vector<std::string>> listings_;  // binary -> its tests
  // Observation counts of the lab being graded: tests checked by the driver on observed values,
  // tests whose checks all ran inside the student's process.
  int observed_tests_ = 0, in_process_tests_ = 0, measured_tests_ = 0;
};

}  // namespace dtl::grade
