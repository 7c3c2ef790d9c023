// dtl-grade: the autograder. Builds nothing itself (`./lab grade` builds first); runs each
// lab's tests under mpirun per world size with a timeout, reads the gtest JSON reports it asked
// for, runs student and reference benchmarks interleaved, scores by the lab's rubric, and
// writes a terminal table and a Gradescope results.json.
//
//   dtl-grade --source . --build build --labs 03 --json results.json
//
// Trust: scores come only from what the grader observes itself: exit statuses, the JSON
// reports written to a directory it created for this run, its own timing, and the test list
// it obtained before running anything. Printed output is shown, never parsed for results; a
// results.json written by student code is overwritten.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "audit.hpp"
#include "rubric.hpp"
#include "run.hpp"
#include "skeleton.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace dtl::grade;

namespace {

struct Options {
  std::string source = ".";
  std::string build = "build";
  std::vector<std::string> labs;
  std::string side = "student";
  std::string json_path = "results.json";
  std::string build_logs;  // directory with labNN.log build logs from ./lab grade
  std::string run_as;      // drop to this user for student code (when grading as root)
  int timeout = 300;       // per mpirun
  int test_timeout = 60;   // per test (the harness watchdog)
  int perf_rounds = 3;
  int perf_max_rounds = 7;  // rounds a result just under the bar may take before it counts
  bool perf = true;
  int max_world = 0;        // grade only world sizes up to this (0: all); quick regrades, self-test
  std::string only_groups;  // grade only test groups whose name contains this
  std::vector<std::string> notes;  // lines for the top of the report (e.g. ignored files)
  bool audit = true;                // the static audit of student objects and sources
  std::string reference_times;      // JSON {lab: seconds}: written with --side reference, read
                                    // with --side student to set each lab's time budget
  double budget_min = 240;          // a lab's time budget: max(this, 5 x the reference's time)
  int output_limit_mb = 64;         // RLIMIT_FSIZE of student runs (their output included)
  int memory_limit_mb = 6144;       // RLIMIT_DATA per process of student runs
  bool all = false;                 // grade untouched skeletons too (else: "not started")
};

struct GroupRun {
  const TestGroup* group = nullptr;
  int world = 1;
  int passed = 0, total = 0;
  double score = 0, max_score = 0;
  std::string reason;  // empty when all passed
  std::string output;
  bool not_implemented = false;  // every test that ran failed with "not implemented"
};

struct PerfResult {
  const PerfCheck* check = nullptr;
  double student = NAN, reference = NAN, ratio = NAN, score = 0;
  std::string reason, output;
};

struct LabResult {
  const Rubric* rubric = nullptr;
  std::string audit_output;  // what the static audit found, if anything
  std::vector<GroupRun> runs;
  std::vector<PerfResult> perf;
  std::string reason;
  bool not_started = false;  // the untouched skeleton: nothing was run
  int pairs_passed = 0, pairs_total = 0;
  double correctness = 0, correctness_max = 0, performance = 0, performance_max = 0;
};

std::string first_line(const std::string& s, size_t max = 200) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > max) line = line.substr(0, max) + "...";
  return line;
}

// "not implemented: lab 03: ring_all_reduce (ring_allreduce.cpp:41)" -> "not implemented: lab 03: ring_all_reduce"
std::string not_implemented_reason(const std::string& msg) {
  auto pos = msg.find("not implemented: ");
  if (pos == std::string::npos) return "";
  std::string r = first_line(msg.substr(pos));
  auto paren = r.rfind(" (");
  return paren == std::string::npos ? r : r.substr(0, paren);
}

// The audit's policy for a lab: its namespace, its rubric's extra patterns, its headers; and
// the student sources to check.
// The compiled student files of lab r on `side` ("student" or "reference"): a lab's given frame
// (FRAME sources) is compiled into the same library but is the course's code, not the
// submission's.
std::vector<std::string> lab_objects(const std::string& build, const Rubric& r,
                                     const std::string& side) {
  std::vector<std::string> objects;
  std::error_code ec;
  const std::string objdir = fmt::format("/dtl_lab{}_{}.dir/", r.lab, side);
  for (auto it = fs::recursive_directory_iterator(fs::path(build) / "labs", ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string p = it->path().string();
    const std::string base = it->path().filename().string();
    const bool student_file = std::any_of(r.student_files.begin(), r.student_files.end(),
                                          [&](const std::string& f) { return base == f + ".o"; });
    if (p.find(objdir) != std::string::npos && student_file) objects.push_back(p);
  }
  return objects;
}

AuditPolicy policy_for(const Rubric& r, const std::string& source, std::vector<std::string>& files) {
  AuditPolicy policy;
  policy.lab = r.lab;
  policy.allow = r.audit_allow;
  policy.deny = r.audit_deny;
  const fs::path lab_dir = fs::path(source) / "labs" / r.slug;
  for (auto& f : r.student_files) files.push_back((lab_dir / f).string());
  std::error_code ec;
  for (auto& e : fs::directory_iterator(lab_dir, ec))
    if (e.path().extension() == ".hpp" || e.path().extension() == ".h")
      policy.headers.push_back(e.path().filename().string());
  return policy;
}

class Grader {
 public:
  explicit Grader(Options o) : opt_(std::move(o)) {
    // Runs happen in the report directory: every path must be absolute.
    opt_.build = fs::absolute(opt_.build).string();
    if (!opt_.build_logs.empty()) opt_.build_logs = fs::absolute(opt_.build_logs).string();
    char tmpl[] = "/tmp/dtl-grade-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create the grader's report directory");
    reports_ = tmpl;
    if (!opt_.run_as.empty()) {
      passwd* pw = getpwnam(opt_.run_as.c_str());
      if (!pw) throw std::runtime_error("--run-as: no user '" + opt_.run_as + "'");
      uid_ = static_cast<int>(pw->pw_uid);
      gid_ = static_cast<int>(pw->pw_gid);
    }
    if (!opt_.reference_times.empty()) load_reference_times();
    adopt_orphans();  // a daemon a submission starts cannot escape to init (reap_student)
  }

  // After every student command: nothing of the student's may outlive it (a setsid daemon
  // that would stop the reference's benchmark or rewrite results.json later).
  void reap_student() const {
    if (opt_.side != "student") return;
    if (uid_ > 0) kill_user_processes(uid_, gid_);
    // As any user: whatever the command left behind is a child of ours (we adopt orphans).
    if (const int n = kill_descendants(); n > 0)
      std::cerr << fmt::format("grader: killed {} process(es) a student command left running\n", n);
  }
  Limits student_limits() const {
    Limits l;
    if (opt_.side == "student") {
      l.file_bytes = static_cast<long long>(opt_.output_limit_mb) << 20;
      l.data_bytes = static_cast<long long>(opt_.memory_limit_mb) << 20;
    }
    return l;
  }
  ~Grader() {
    std::error_code ec;
    fs::remove_all(reports_, ec);
  }

  LabResult grade(const Rubric& r) {
    LabResult lab;
    lab.rubric = &r;
    const auto lab_start = std::chrono::steady_clock::now();
    // A time budget for the whole lab, from the reference's own time when known: a submission
    // that sleeps just under every timeout cannot keep the grader busy for hours.
    budget_ = -1;
    if (opt_.side == "student" && reference_seconds_.count(r.lab))
      budget_ = std::max(opt_.budget_min, 5 * reference_seconds_[r.lab]);
    const bool student = opt_.side == "student";
    // An untouched skeleton scores 0 (CI's skeleton check proves it): nothing to build or run.
    std::string not_started;
    if (student && !opt_.all && untouched_skeleton(r, opt_.source))
      not_started = fmt::format("not started: the lab {} files are the untouched skeleton "
                                "(./lab grade --all runs its tests anyway)", r.lab);
    std::string rejected;
    if (student && opt_.audit && not_started.empty()) rejected = audit(r, lab.audit_output);
    std::vector<size_t> selected;  // the groups to grade (--only-groups), in rubric order
    for (size_t i = 0; i < r.tests.size(); ++i)
      if (opt_.only_groups.empty() || r.tests[i].name.find(opt_.only_groups) != std::string::npos)
        selected.push_back(i);
    auto in_sizes = [&](const TestGroup& g, int n) {
      return std::find(g.world_sizes.begin(), g.world_sizes.end(), n) != g.world_sizes.end();
    };
    // Public tests first, world sizes ascending, one job per binary and size. A group whose tests
    // all fail "not implemented" is not run at larger sizes; when every public group is, the lab
    // stops there (the hidden tests call the same unimplemented functions).
    std::map<std::pair<size_t, int>, GroupRun> rows;
    std::map<size_t, std::string> stopped;  // group -> why its larger sizes do not run
    std::string lab_stopped;
    for (const std::string binary : {"test", "grade"}) {
      std::set<int> sizes;
      for (size_t i : selected)
        if (r.tests[i].binary == binary)
          for (int n : r.tests[i].world_sizes)
            if (opt_.max_world == 0 || n <= opt_.max_world) sizes.insert(n);
      for (int n : sizes) {
        std::vector<size_t> here;
        for (size_t i : selected) {
          const TestGroup& g = r.tests[i];
          if (g.binary != binary || !in_sizes(g, n)) continue;
          if (!not_started.empty()) {
            rows[{i, n}] = not_run(g, n, not_started, "");
          } else if (!rejected.empty()) {
            rows[{i, n}] = not_run(g, n, rejected, lab.audit_output);
          } else if (!lab_stopped.empty()) {
            rows[{i, n}] = not_run(g, n, lab_stopped, "");
          } else if (stopped.count(i)) {
            rows[{i, n}] = not_run(g, n, stopped[i], "");
          } else if (budget_ >= 0 && seconds_since(lab_start) > budget_) {
            rows[{i, n}] = not_run(g, n,
                                   fmt::format("time budget of {:.0f} s for lab {} used up (the "
                                               "reference needs {:.0f} s)", budget_, r.lab,
                                               reference_seconds_[r.lab]), "");
          } else {
            here.push_back(i);
          }
        }
        if (here.empty()) continue;
        const double left = budget_ < 0 ? -1 : budget_ - seconds_since(lab_start);
        auto runs = run_groups(r, binary, here, n, left);
        for (size_t k = 0; k < here.size(); ++k) {
          if (runs[k].not_implemented)
            stopped[here[k]] = fmt::format("{} (at n={}: larger world sizes not run)", runs[k].reason, n);
          rows[{here[k], n}] = runs[k];
        }
      }
      if (binary == "test" && lab_stopped.empty()) {
        size_t public_groups = 0, unimplemented = 0;
        for (size_t i : selected)
          if (r.tests[i].binary == "test") {
            ++public_groups;
            unimplemented += stopped.count(i);
          }
        if (public_groups > 0 && unimplemented == public_groups)
          lab_stopped = "not implemented: every public test fails \"not implemented\", so the "
                        "hidden tests were not run";
      }
    }
    for (size_t i : selected)
      for (int n : r.tests[i].world_sizes)
        if (auto it = rows.find({i, n}); it != rows.end()) lab.runs.push_back(it->second);
    if (!student && !opt_.reference_times.empty()) reference_seconds_[r.lab] = seconds_since(lab_start);
    std::string first_reason;
    for (auto& run : lab.runs) {
      lab.correctness += run.score;
      lab.correctness_max += run.max_score;
      lab.pairs_passed += run.passed;
      lab.pairs_total += run.total;
      if (first_reason.empty() && !run.reason.empty()) first_reason = run.reason;
    }
    const bool correct = lab.pairs_total > 0 && lab.pairs_passed == lab.pairs_total && rejected.empty();
    for (auto& c : r.performance) {
      lab.performance_max += c.points;
      PerfResult p = correct ? (opt_.perf ? run_perf(r, c) : skipped(c, "skipped (--no-perf)"))
                             : skipped(c, "skipped: performance counts only when every test passes");
      lab.performance += p.score;
      if (first_reason.empty() && !p.reason.empty() && correct && opt_.perf) first_reason = p.reason;
      lab.perf.push_back(p);
    }
    lab.reason = first_reason;
    if (!not_started.empty()) {
      lab.reason = "not started (untouched skeleton)";
      lab.not_started = true;
    }
    if (!lab_stopped.empty() || (!stopped.empty() && stopped.size() == selected.size()))
      lab.reason += " (every test \"not implemented\": grading stopped at the smallest world size)";
    return lab;
  }

 public:
  // Reference times (the budget's base) from an earlier `--side reference` run.
  void load_reference_times() {
    std::ifstream in(opt_.reference_times);
    json j = json::parse(in, nullptr, false);
    if (j.is_object())
      for (auto& [lab, seconds] : j.items())
        if (seconds.is_number()) reference_seconds_[lab] = seconds.get<double>();
  }
  void save_reference_times() const {
    if (opt_.side != "reference" || opt_.reference_times.empty()) return;
    json j = json::object();
    std::ifstream in(opt_.reference_times);
    json old = json::parse(in, nullptr, false);
    if (old.is_object()) j = old;
    for (auto& [lab, seconds] : reference_seconds_) j[lab] = seconds;
    std::ofstream(opt_.reference_times) << j.dump(2) << "\n";
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  GroupRun not_run(const TestGroup& g, int n, const std::string& reason, const std::string& output) {
    GroupRun run;
    run.group = &g;
    run.world = n;
    run.max_score = g.points / static_cast<double>(g.world_sizes.size());
    run.total = 1;
    run.reason = reason;
    run.output = output;
    return run;
  }

  // The static audit (audit.hpp) of the student's objects and sources: "" if clean, else the
  // reason every test of the lab gets 0, with the full list in `output`.
  std::string audit(const Rubric& r, std::string& output) {
    std::vector<std::string> sources;
    AuditPolicy policy = policy_for(r, opt_.source, sources);
    const std::vector<std::string> objects = lab_objects(opt_.build, r, "student");
    // The shared libraries the tests load, from the reference's binary (never run student code
    // to learn something about it).
    const std::string ref = bin(r, "test", "reference");
    if (fs::exists(ref)) {
      try {
        std::istringstream ldd(capture("ldd '" + ref + "' 2>/dev/null"));
        for (std::string line; std::getline(ldd, line);) {
          auto arrow = line.find("=> /");
          if (arrow == std::string::npos) continue;
          std::string path = line.substr(arrow + 3);
          path = path.substr(0, path.find(" ("));
          // The libraries whose functions the tests, the harness and the runtime call (LibTorch
          // alone pulls in ~300 others, opencv included, that no test reaches).
          static const std::regex relevant(
              R"(/lib((torch|c10|stdc\+\+|mpi|open-pal|open-rte|gtest|gmock|fmt|benchmark|dtl)[^/]*|c|m|gcc_s)\.so[^/]*$)");
          if (path.rfind(opt_.build, 0) == 0 || std::regex_search(path, relevant))
            policy.libraries.push_back(path);
        }
      } catch (const std::exception&) {
      }
    }
    std::vector<std::string> problems;
    try {
      problems = audit_sources(sources, policy);
      if (objects.empty() && fs::exists(bin(r, "test", "student")))
        problems.push_back("the student objects were not found in the build directory");
      auto more = audit_objects(objects, policy);
      problems.insert(problems.end(), more.begin(), more.end());
    } catch (const std::exception& e) {
      problems.push_back(std::string("the audit could not run: ") + e.what());
    }
    if (problems.empty()) return "";
    output = "The grader checks what your code calls and defines before running it (see "
             "grading/README.md, \"What the grader allows\"). Found:\n";
    for (auto& pr : problems) output += "  " + pr + "\n";
    return fmt::format("rejected by the code audit: {}{}", problems.front(),
                       problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : "");
  }

  std::string bin(const Rubric& r, const std::string& kind, const std::string& side) const {
    return (fs::path(opt_.build) / "bin" / fmt::format("lab{}_{}_{}", r.lab, kind, side)).string();
  }

  std::string build_log(const Rubric& r) const {
    if (opt_.build_logs.empty()) return "";
    std::ifstream in(fs::path(opt_.build_logs) / fmt::format("lab{}.log", r.lab));
    std::stringstream ss;
    ss << in.rdbuf();
    // Compiler errors are what the student needs: keep the lines around "error".
    std::string log = ss.str(), out;
    std::istringstream lines(log);
    std::string line;
    int keep = 0;
    while (std::getline(lines, line)) {
      if (line.find("error") != std::string::npos) keep = 4;
      if (keep > 0) {
        out += line + "\n";
        --keep;
      }
      if (out.size() > 6000) break;
    }
    return out.empty() ? tail(log, 30) : out;
  }

  // Student commands run as the unprivileged user when grading as root (Gradescope); the
  // reference's run as the grader, out of the student's reach (no signal, no ptrace).
  std::vector<std::string> wrap(std::vector<std::string> cmd) const {
    if (opt_.run_as.empty() || opt_.side != "student") return cmd;
    std::vector<std::string> out = {"setpriv", fmt::format("--reuid={}", uid_),
                                    fmt::format("--regid={}", gid_), "--clear-groups", "--"};
    out.insert(out.end(), cmd.begin(), cmd.end());
    return out;
  }

  // cmake/mpirun.env, compiled in (the one place CMake, ./lab and the grader read it from),
  // plus: no emulator, trace or Gantt chart may leak into a graded run from the environment.
  std::vector<std::string> mpi_env() const {
    std::vector<std::string> env = split_list(DTL_MPIRUN_ENV);
    for (const char* clear : {"DTL_NET=", "DTL_TRACE=", "DTL_GANTT="}) env.push_back(clear);
    return env;
  }
  static std::vector<std::string> mpirun(int n) {
    std::vector<std::string> cmd = {"mpirun", "-n", std::to_string(n)};
    for (auto& f : split_list(DTL_MPIRUN_FLAGS)) cmd.push_back(f);
    return cmd;
  }
  static std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string item; std::getline(in, item, '|');)
      if (!item.empty()) out.push_back(item);
    return out;
  }

  // Every test of a binary, asked once before running anything (the single-process list mode of
  // the test main), so a crash cannot hide how many tests there were; each group's share is
  // matched against its filter here.
  const std::vector<std::string>& listing(const std::string& exe, bool trusted) {
    auto cached = listings_.find(exe);
    if (cached != listings_.end()) return cached->second;
    std::vector<std::string> cmd = {exe, "--gtest_list_tests"};
    auto res = run_command(trusted ? cmd : wrap(cmd), 120, mpi_env(), "",
                           trusted ? Limits{} : student_limits());
    if (!trusted) reap_student();
    std::vector<std::string> names;
    std::istringstream lines(res.output);
    std::string line, suite;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      if (line[0] != ' ' && line.back() == '.') {
        suite = line;
      } else if (line.rfind("  ", 0) == 0 && !suite.empty()) {
        std::string test = line.substr(2);
        test = test.substr(0, test.find(' '));  // drop "  # GetParam() = ..."
        names.push_back(suite + test);
      }
    }
    return listings_[exe] = names;
  }

  // One mpirun of a binary at one world size, and what the grader observed of it.
  struct Job {
    RunResult res;
    int timeout = 0;
    json report, watchdog;
    std::map<std::string, std::string> failed;  // test -> first failure message
    std::set<std::string> passed, skipped;
  };

  Job run_job(const std::string& exe, const std::string& filter, int n, int timeout) {
    Job job;
    job.timeout = timeout;
    std::string report = fmt::format("{}/{}_n{}_{}.json", reports_, fs::path(exe).filename().string(),
                                     n, counter_++);
    if (!opt_.run_as.empty()) {
      // The run may write its report here, nowhere else of the grader's.
      (void)chown(reports_.c_str(), static_cast<uid_t>(uid_), static_cast<gid_t>(gid_));
    }
    const std::string watchdog_report = report + ".watchdog";
    std::vector<std::string> cmd = mpirun(n);
    for (std::string a : {exe, "--gtest_filter=" + filter, "--gtest_output=json:" + report,
                          fmt::format("--dtl_timeout={}", opt_.test_timeout)})
      cmd.push_back(a);
    auto env = mpi_env();
    env.push_back("DTL_WATCHDOG_REPORT=" + watchdog_report);  // the watchdog's findings, as JSON
    job.res = run_command(wrap(cmd), timeout, env, reports_, student_limits());
    reap_student();
    std::ifstream watchdog_in(watchdog_report);
    job.watchdog = json::parse(watchdog_in, nullptr, false);
    std::remove(watchdog_report.c_str());
    std::ifstream in(report);
    job.report = json::parse(in, nullptr, false);
    std::remove(report.c_str());
    if (!job.report.is_discarded() && job.report.contains("testsuites")) {
      for (auto& suite : job.report["testsuites"])
        for (auto& t : suite.value("testsuite", json::array())) {
          std::string name = suite.value("name", "") + "." + t.value("name", "");
          if (t.contains("failures") && !t["failures"].empty())
            job.failed[name] = t["failures"][0].value("failure", "failed");
          else if (t.value("result", "") == "COMPLETED")
            job.passed.insert(name);
          else if (t.value("result", "") == "SKIPPED")
            job.skipped.insert(name);
        }
    }
    return job;
  }

  // Per-test results count only from a job that ended by itself: exit 0, or gtest's exit 1
  // ("some test failed") with a report that lists every expected test. A report from a job that
  // crashed, hung, was killed or exited otherwise counts for nothing.
  static bool trusted(const Job& job, const std::vector<std::string>& expected) {
    size_t reported = 0;
    for (auto& name : expected)
      reported += job.passed.count(name) + job.failed.count(name) + job.skipped.count(name);
    const bool complete = !expected.empty() && reported == expected.size();
    const RunResult& res = job.res;
    return !res.timed_out && !res.output_limited && res.signal == 0 &&
           (res.exit_code == 0 || (res.exit_code == 1 && complete));
  }

  // A group's row at world size n from the job that ran its `expected` tests (and maybe others).
  GroupRun score_group(const TestGroup& g, int n, const std::vector<std::string>& expected,
                       const Job& job) {
    GroupRun run;
    run.group = &g;
    run.world = n;
    run.max_score = g.points / static_cast<double>(g.world_sizes.size());  // of the full rubric
    run.total = std::max<int>(1, static_cast<int>(expected.size()));
    run.output = tail(job.res.output, 60);
    const RunResult& res = job.res;
    const bool ok = trusted(job, expected);
    std::map<std::string, std::string> failed;  // this group's failures only
    for (auto& name : expected)
      if (auto it = job.failed.find(name); it != job.failed.end()) failed.insert(*it);
    // A test that skips itself at this world size (GTEST_SKIP: "needs 2 ranks") checked nothing:
    // it earns nothing and weighs nothing, else an untouched skeleton would score on it. The
    // reference skips the same tests, so full marks stay reachable.
    int skips = 0, not_implemented = 0;
    std::vector<std::string> missing;
    for (auto& name : expected) {
      const bool p = job.passed.count(name), s = job.skipped.count(name);
      if (ok && p) ++run.passed;
      if (s) ++skips;
      if (!p && !s && !failed.count(name)) missing.push_back(name);
    }
    for (auto& [name, msg] : failed) not_implemented += !not_implemented_reason(msg).empty();
    if (expected.empty() && ok && res.exit_code == 0 && job.failed.empty() && !job.passed.empty())
      run.passed = run.total;
    if (!expected.empty() && ok && skips > 0) run.total -= skips;
    run.score = run.total > 0 ? run.max_score * run.passed / run.total : 0.0;
    // Every test that ran failed with "not implemented": the grader need not try larger sizes.
    run.not_implemented = ok && run.total > 0 && not_implemented == run.total;
    if (run.total == 0) {
      run.reason = fmt::format("every test of this group skips itself at n={}: nothing was "
                               "checked (a rubric error: drop that world size)", n);
      return run;
    }

    if (run.passed == run.total) return run;
    if (res.output_limited) {
      run.reason = fmt::format("stopped at n={}: its output reached the limit of {} MiB",
                               n, opt_.output_limit_mb);
    } else if (res.timed_out) {
      run.reason = fmt::format("timed out after {} s at n={} (a hang: see the watchdog's report)",
                               job.timeout, n);
    } else if (!job.watchdog.is_discarded() && job.watchdog.contains("summary")) {
      // Who waits where, who is missing: "ranks [0,1]: waiting in all_reduce #2 on comm ...".
      std::string states;
      for (auto& entry : job.watchdog["summary"]) {
        std::string ranks;
        for (auto& r : entry["ranks"]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r.get<int>());
        states += fmt::format("{}ranks [{}]: {}", states.empty() ? "" : "; ", ranks,
                              entry.value("state", "?"));
      }
      run.reason = fmt::format("hang at n={} stopped by the watchdog: {}", n, first_line(states, 300));
    } else if (auto sig = res.output.find("exited on signal"); sig != std::string::npos) {
      auto start = res.output.rfind('\n', sig);
      run.reason = fmt::format("crashed at n={}: {}", n,
                               first_line(res.output.substr(start == std::string::npos ? 0 : start + 1)));
    } else if (!failed.empty()) {
      for (auto& [name, msg] : failed) {
        std::string ni = not_implemented_reason(msg);
        if (!ni.empty()) {
          run.reason = ni;
          break;
        }
      }
      if (run.reason.empty())
        run.reason = fmt::format("{} of {} tests fail at n={}; first: {}: {}", run.total - run.passed,
                                 run.total, n, failed.begin()->first, first_line(failed.begin()->second, 160));
    } else if (ok && !missing.empty()) {
      run.reason = fmt::format("{} of {} expected tests did not run at n={} (first: {}); a test "
                               "that does not run counts as failed", missing.size(), run.total, n,
                               missing.front());
    } else if (job.report.is_discarded()) {
      run.reason = fmt::format("no test report at n={} (exit code {}{}): the job died before the "
                               "end", n, res.exit_code,
                               res.signal ? fmt::format(", signal {}", res.signal) : "");
    } else {
      run.reason = fmt::format("exit code {} at n={} although the report shows no failure",
                               res.exit_code, n);
    }
    std::string details;
    for (auto& [name, msg] : failed) details += fmt::format("FAILED {}: {}\n", name, first_line(msg, 400));
    run.output = details + "---- output (tail) ----\n" + run.output;
    return run;
  }

  // The rows of `groups` (indices into r.tests, all of one binary) at world size n. One job runs
  // all their tests: a process start per binary and size, not per group. When that job does not
  // end by itself (a crash, a hang, the output cap), its report counts for nothing, so each group
  // runs again on its own: one group's crash must not cost the others their points.
  std::vector<GroupRun> run_groups(const Rubric& r, const std::string& binary,
                                   const std::vector<size_t>& groups, int n, double seconds_left) {
    std::vector<GroupRun> rows;
    const std::string exe = bin(r, binary, opt_.side);
    if (!fs::exists(exe)) {
      for (size_t i : groups) {
        GroupRun run;
        run.group = &r.tests[i];
        run.world = n;
        run.max_score = run.group->points / static_cast<double>(run.group->world_sizes.size());
        run.total = 1;
        run.reason = opt_.side == "student" ? "does not compile" : "reference binary missing";
        run.output = fmt::format("{} was not built.\n{}", fs::path(exe).filename().string(), build_log(r));
        rows.push_back(run);
      }
      return rows;
    }
    // The tests that must pass come from the reference's binary when there is one: the
    // student's process cannot shrink the list (a rewritten --gtest_filter runs fewer tests,
    // and every missing test counts as failed).
    const std::string ref = bin(r, binary, "reference");
    const bool from_reference = opt_.side == "student" && fs::exists(ref);
    const auto& all = listing(from_reference ? ref : exe, from_reference || opt_.side != "student");
    std::vector<std::vector<std::string>> expected(groups.size());
    std::vector<std::string> union_tests;
    std::set<std::string> seen;
    int timeout = 0;
    for (size_t k = 0; k < groups.size(); ++k) {
      const TestGroup& g = r.tests[groups[k]];
      for (auto& name : all)
        if (filter_matches(g.filter, name)) {
          expected[k].push_back(name);
          if (seen.insert(name).second) union_tests.push_back(name);
        }
      timeout += g.timeout > 0 ? g.timeout : opt_.timeout;
    }
    auto clamp = [&](int t) {
      return seconds_left >= 0 ? std::max(1, std::min(t, static_cast<int>(seconds_left) + 1)) : t;
    };
    // The groups' own filters when the listing failed (nothing to merge by name).
    const auto start = std::chrono::steady_clock::now();
    const bool merge = groups.size() > 1 && !union_tests.empty();
    if (merge) {
      std::string filter;
      for (auto& name : union_tests) filter += (filter.empty() ? "" : ":") + name;
      Job job = run_job(exe, filter, n, clamp(std::min(timeout, 2 * opt_.timeout)));
      if (trusted(job, union_tests)) {
        for (size_t k = 0; k < groups.size(); ++k)
          rows.push_back(score_group(r.tests[groups[k]], n, expected[k], job));
        return rows;
      }
    }
    for (size_t k = 0; k < groups.size(); ++k) {
      const TestGroup& g = r.tests[groups[k]];
      const double left = seconds_left < 0 ? -1 : seconds_left - seconds_since(start);
      int t = g.timeout > 0 ? g.timeout : opt_.timeout;
      if (seconds_left >= 0) t = std::max(1, std::min(t, static_cast<int>(left) + 1));
      Job job = run_job(exe, g.filter, n, t);
      rows.push_back(score_group(g, n, expected[k], job));
    }
    return rows;
  }

  PerfResult skipped(const PerfCheck& c, const std::string& why) {
    PerfResult p;
    p.check = &c;
    p.reason = why;
    return p;
  }

  // One benchmark run; NaN if it failed.
  double bench_once(const std::string& exe, const PerfCheck& c, std::string& log) {
    std::string out = fmt::format("{}/bench_{}.json", reports_, counter_++);
    std::vector<std::string> cmd = mpirun(c.ranks);
    for (std::string a : {exe, "--benchmark_filter=^" + c.benchmark, "--benchmark_out=" + out,
                          std::string("--benchmark_out_format=json")})
      cmd.push_back(a);
    const bool mine = exe == bin_of_side_;
    auto res = run_command(mine ? wrap(cmd) : cmd, opt_.timeout, mpi_env(), reports_,
                           mine ? student_limits() : Limits{});
    if (mine) reap_student();
    std::ifstream in(out);
    json j = json::parse(in, nullptr, false);
    std::remove(out.c_str());
    if (res.timed_out || res.exit_code != 0 || j.is_discarded()) {
      log += fmt::format("{}: {}\n", fs::path(exe).filename().string(),
                         res.timed_out ? "timed out" : "failed (exit " + std::to_string(res.exit_code) + ")");
      log += tail(res.output, 15);
      return NAN;
    }
    for (auto& b : j.value("benchmarks", json::array())) {
      std::string name = b.value("name", "");
      if (name.rfind(c.benchmark, 0) != 0 || b.value("run_type", "iteration") != "iteration") continue;
      if (b.value("error_occurred", false)) {
        log += fmt::format("{}: {}: {}\n", fs::path(exe).filename().string(), name,
                           b.value("error_message", "error"));
        return NAN;
      }
      if (c.counter == "real_time") return b.value("real_time", NAN);
      if (b.contains(c.counter)) return b[c.counter].get<double>();
    }
    log += fmt::format("{}: no benchmark '{}' with counter '{}'\n", fs::path(exe).filename().string(),
                       c.benchmark, c.counter);
    return NAN;
  }

  PerfResult run_perf(const Rubric& r, const PerfCheck& c) {
    PerfResult p;
    p.check = &c;
    const std::string mine = bin(r, "bench", opt_.side), ref = bin(r, "bench", "reference");
    bin_of_side_ = opt_.side == "student" ? mine : "";
    if (!fs::exists(mine) || !fs::exists(ref)) return skipped(c, "benchmark binary missing");
    // Interleaved, so both sides see the same machine; medians per side. The order flips every
    // round (A B, B A, ...) so neither side always runs right after the other. A result just
    // under the bar (within a factor 2 of it) is measured again, up to --perf-max-rounds: on a
    // shared 2-core machine one slow round can cost an honest submission its points, while a
    // clearly slow or clearly fast one is settled by the first rounds.
    std::vector<double> a, b;
    auto median = [](std::vector<double> v) -> double {
      v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
      if (v.empty()) return std::nan("");
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    auto ratio_now = [&] {
      const double s = median(a), r = median(b);
      if (!(s > 0) || !(r > 0)) return std::nan("");
      return c.higher_is_better ? s / r : r / s;
    };
    const int max_rounds = std::max(opt_.perf_rounds, opt_.perf_max_rounds);
    for (int i = 0; i < max_rounds; ++i) {
      if (i >= opt_.perf_rounds) {
        const double q = ratio_now();
        if (std::isnan(q) || q >= c.min_ratio || q < 0.5 * c.min_ratio) break;
      }
      if (i % 2 == 0) {
        a.push_back(bench_once(mine, c, p.output));
        b.push_back(bench_once(ref, c, p.output));
      } else {
        b.push_back(bench_once(ref, c, p.output));
        a.push_back(bench_once(mine, c, p.output));
      }
    }
    p.student = median(a);
    p.reference = median(b);
    if (std::isnan(p.student) || std::isnan(p.reference) || p.student <= 0 || p.reference <= 0) {
      p.reason = "benchmark failed: " + first_line(p.output);
      return p;
    }
    p.ratio = c.higher_is_better ? p.student / p.reference : p.reference / p.student;
    p.score = p.ratio >= c.min_ratio ? c.points : 0;
    p.output += fmt::format("{}: yours {:.4g}, reference {:.4g} (median of {} interleaved runs): "
                            "{:.2f} x reference, needs {:.2f}\n", c.counter, p.student, p.reference,
                            a.size(), p.ratio, c.min_ratio);
    if (p.score == 0)
      p.reason = fmt::format("{}: {:.2f} x the reference, needs {:.2f}", c.name, p.ratio, c.min_ratio);
    return p;
  }

  Options opt_;
  std::string reports_;
  std::string bin_of_side_;  // the student's benchmark binary (runs as the student)
  double budget_ = -1;       // seconds for the lab being graded; -1: none
  std::map<std::string, double> reference_seconds_;
  int uid_ = -1, gid_ = -1;
  int counter_ = 0;
  std::map<std::string, std::vector<std::string>> listings_;  // binary -> its tests
};

std::string status_of(double score, double max) { return score >= max - 1e-9 ? "passed" : "failed"; }

json to_gradescope(const std::vector<LabResult>& labs, const Options& opt, double seconds,
                   const std::string& table) {
  json tests = json::array();
  json leaderboard = json::array();
  double total = 0;
  for (auto& lab : labs) {
    const Rubric& r = *lab.rubric;
    int k = 0;
    for (auto& run : lab.runs) {
      json t = {{"name", fmt::format("lab {} | {} (n={})", r.lab, run.group->name, run.world)},
                {"number", fmt::format("{}.{}", r.lab, ++k)},
                // Unrounded, like max_score: a group's points split over world sizes are not
                // round (10 / 3), and full marks must add up to exactly the maximum.
                {"score", run.score},
                {"max_score", run.max_score},
                {"status", status_of(run.score, run.max_score)},
                {"visibility", run.group->visibility},
                {"output", run.reason.empty() ? fmt::format("{}/{} tests pass", run.passed, run.total)
                                               : run.reason + "\n\n" + run.output}};
      tests.push_back(t);
    }
    int q = 0;
    for (auto& p : lab.perf) {
      tests.push_back({{"name", fmt::format("lab {} | performance: {}", r.lab, p.check->name)},
                       {"number", fmt::format("{}.p{}", r.lab, ++q)},
                       {"score", p.score},
                       {"max_score", p.check->points},
                       {"status", status_of(p.score, p.check->points)},
                       {"visibility", "visible"},
                       {"output", (p.reason.empty() ? std::string("meets the target") : p.reason) +
                                      "\n" + p.output}});
      if (!std::isnan(p.student))
        leaderboard.push_back({{"name", fmt::format("lab {} {}", r.lab, p.check->name)},
                               {"value", p.student},
                               {"order", p.check->higher_is_better ? "desc" : "asc"}});
    }
    total += lab.correctness + lab.performance;
  }
  const std::string& output = table;  // already ends with the notes (main adds them once)
  return {{"score", std::round(total * 100) / 100},
          {"execution_time", static_cast<int>(seconds)},
          {"output", output},
          {"visibility", "visible"},
          {"stdout_visibility", "visible"},
          {"tests", tests},
          {"leaderboard", leaderboard}};
}

std::string table(const std::vector<LabResult>& labs, const Options& opt) {
  std::string out = fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}  {}\n", "lab", "title",
                                "tests", "correctness", "perf", "total", "reason");
  double got = 0, max = 0;
  for (auto& lab : labs) {
    const Rubric& r = *lab.rubric;
    std::string title = r.title.size() > 44 ? r.title.substr(0, 41) + "..." : r.title;
    double t = lab.correctness + lab.performance, m = lab.correctness_max + lab.performance_max;
    got += t;
    max += m;
    out += fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}  {}\n", r.lab, title,
                       lab.not_started ? "-" : fmt::format("{}/{}", lab.pairs_passed, lab.pairs_total),
                       fmt::format("{:.1f}/{:g}", lab.correctness, lab.correctness_max),
                       fmt::format("{:.0f}/{:g}", lab.performance, lab.performance_max),
                       fmt::format("{:.1f}/{:g}", t, m), lab.reason.empty() ? "ok" : lab.reason);
    for (auto& p : lab.perf)
      if (!std::isnan(p.student))
        out += fmt::format("      performance {}: yours {:.4g}, reference {:.4g} ({:.2f} x, needs {:.2f})\n",
                           p.check->name, p.student, p.reference, p.ratio, p.check->min_ratio);
  }
  out += fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}\n", "", "total", "", "", "",
                     fmt::format("{:.1f}/{:g}", got, max));
  out += fmt::format("graded: the {} build\n", opt.side == "student" ? "student" : "reference (--solutions)");
  const auto untouched = std::count_if(labs.begin(), labs.end(), [](const LabResult& l) { return l.not_started; });
  if (untouched > 0)
    out += fmt::format("not started: {} lab(s) whose files are the untouched skeleton (nothing was built "
                       "or run). Start with a lab's handout, labs/NN_slug/README.md; `./lab test NN` "
                       "runs its public tests; `./lab grade --all` grades untouched labs too.\n",
                       untouched);
  for (auto& lab : labs)
    if (lab.rubric->autograder_only_points > 0)
      out += fmt::format("lab {}: these are the public tests only; the hidden tests and performance "
                         "checks ({:.0f} of 100 points) are graded by the course's autograder\n",
                         lab.rubric->lab, lab.rubric->autograder_only_points);
  return out;
}

// The grader's self-test reads back a results.json: totals by kind, and text searches.
int check_results(const std::string& file, const std::vector<std::string>& conditions) {
  std::ifstream in(file);
  json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded()) {
    std::cerr << file << ": missing or not JSON\n";
    return 1;
  }
  std::map<std::string, double> v = {{"score", doc.value("score", 0.0)}};
  for (auto& t : doc["tests"]) {
    const bool perf = t.value("number", "").find(".p") != std::string::npos;
    v[perf ? "performance" : "correctness"] += t.value("score", 0.0);
    v[perf ? "performance_max" : "correctness_max"] += t.value("max_score", 0.0);
    v["max"] += t.value("max_score", 0.0);
  }
  const std::string output = doc.value("output", ""), all = doc.dump();
  int bad = 0;
  for (auto& c : conditions) {
    bool ok = false;
    auto q = c.find(" contains '");
    if (q != std::string::npos) {
      std::string what = c.substr(0, q), text = c.substr(q + 11, c.size() - q - 12);
      ok = (what == "reason" ? output : all).find(text) != std::string::npos;
    } else {
      std::istringstream ss(c);
      std::string lhs, op, rhs;
      ss >> lhs >> op >> rhs;
      double a = v[lhs], b = v.count(rhs) ? v[rhs] : std::atof(rhs.c_str());
      ok = op == "==" ? std::fabs(a - b) < 1e-6 : op == ">" ? a > b : op == "<" ? a < b
         : op == ">=" ? a >= b - 1e-6 : false;
      if (!ok) std::cerr << fmt::format("{} = {:g}, {} = {:g}\n", lhs, a, rhs, b);
    }
    std::cerr << (ok ? "ok: " : "FAILED: ") << c << "\n";
    bad += !ok;
  }
  if (bad) std::cerr << output;
  return bad ? 1 : 0;
}

// ./lab test NN ends with this: one row per test, one column per world size, so a student sees
// at a glance which tasks pass, which are not implemented yet, and the first failure of each.
// `names` are ctest entries "labNN.side.nK"; their gtest reports are DIR/<name>.json.
int summarize(const std::string& dir, const std::vector<std::string>& names) {
  std::map<std::string, std::map<int, std::string>> cells;  // test -> world size -> verdict
  std::map<std::string, std::string> first_failure;
  std::set<std::string> todo;  // "lab 03: ring_all_reduce (Task 4)", once each
  std::vector<std::string> missing;
  std::set<int> worlds;
  for (const auto& name : names) {
    const auto dot = name.rfind(".n");
    const int n = dot == std::string::npos ? 0 : std::atoi(name.c_str() + dot + 2);
    worlds.insert(n);
    std::ifstream in(dir + "/" + name + ".json");
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("testsuites")) {
      missing.push_back(name);
      continue;
    }
    for (auto& suite : j["testsuites"])
      for (auto& t : suite.value("testsuite", json::array())) {
        const std::string test = suite.value("name", "") + "." + t.value("name", "");
        std::string verdict = "ok";
        if (t.value("result", "") == "SKIPPED") verdict = "skip";
        if (t.contains("failures") && !t["failures"].empty()) {
          const std::string msg = t["failures"][0].value("failure", "failed");
          const std::string ni = not_implemented_reason(msg);
          verdict = ni.empty() ? "FAIL" : "n.i.";
          if (!ni.empty())
            todo.insert(ni.substr(std::string("not implemented: ").size()));
          else if (!first_failure.count(test))
            first_failure[test] = fmt::format("n={}: {}", n, first_line(msg, 200));
        }
        cells[test][n] = verdict;
      }
  }
  size_t width = 10;
  for (auto& [test, row] : cells) width = std::max(width, test.size());
  std::string out = fmt::format("\n{:<{}}", "test", width);
  for (int n : worlds) out += fmt::format(" {:>5}", fmt::format("n={}", n));
  out += "\n";
  int ok = 0, total = 0;
  for (auto& [test, row] : cells) {
    out += fmt::format("{:<{}}", test, width);
    bool all_ok = true;
    for (int n : worlds) {
      auto it = row.find(n);
      const std::string v = it == row.end() ? "-" : it->second;
      all_ok = all_ok && (v == "ok" || v == "skip" || v == "-");
      out += fmt::format(" {:>5}", v);
    }
    out += "\n";
    ++total;
    ok += all_ok;
  }
  out += fmt::format("{} of {} tests pass at every world size", ok, total);
  out += missing.empty() ? "\n" : fmt::format("; no report from {} (crashed, hung or not built: "
                                               "see the output above)\n", fmt::join(missing, ", "));
  if (!todo.empty()) {
    out += "n.i. = not implemented yet:\n";
    for (auto& t : todo) out += "  " + t + "\n";
  }
  if (!first_failure.empty()) {
    out += "first failure of each failing test:\n";
    for (auto& [test, msg] : first_failure) out += fmt::format("  {}  {}\n", test, msg);
  }
  std::cout << out << std::flush;
  return ok == total && missing.empty() ? 0 : 1;
}

// A student release's rubric: the public groups (binary "test") only; the points of the rest
// are recorded so `./lab grade` can say what the course's autograder adds.
int print_public_rubric(const std::string& file) {
  std::ifstream in(file);
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << file << ": not valid JSON\n";
    return 2;
  }
  double hidden = 0;
  json tests = json::array();
  for (auto& t : j.value("tests", json::array())) {
    if (t.value("binary", "") == "test")
      tests.push_back(t);
    else
      hidden += t.value("points", 0.0);
  }
  for (auto& p : j.value("performance", json::array())) hidden += p.value("points", 0.0);
  j["tests"] = tests;
  j.erase("performance");
  j["autograder_only_points"] = hidden;
  std::cout << j.dump(2) << "\n";
  return 0;
}

// --validate: what a rubric promises must exist. Needs the reference build (./lab build).
int validate_rubrics(const Options& opt) {
  int bad = 0;
  auto problem = [&](const Rubric& r, const std::string& what) {
    std::cerr << fmt::format("lab {}: {}\n", r.lab, what);
    ++bad;
  };
  std::vector<Rubric> rubrics;
  try {
    rubrics = load_rubrics(opt.source, opt.labs);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  const fs::path bindir = fs::path(opt.build) / "bin";
  std::map<std::string, std::vector<std::string>> listings;  // binary -> "Suite.Test" names
  for (auto& r : rubrics) {
    const fs::path lab_dir = fs::path(opt.source) / "labs" / r.slug;
    const double total = r.max_points() + r.autograder_only_points;
    if (std::fabs(total - 100) > 1e-6) problem(r, fmt::format("points total {:g}, not 100", total));
    for (auto& f : r.student_files)
      if (!fs::exists(lab_dir / f)) problem(r, fmt::format("student file {} does not exist", f));
    const bool has_reference = fs::exists(fs::path(opt.source) / "solutions" / r.slug);
    const std::string side = has_reference ? "reference" : "student";
    for (auto& g : r.tests) {
      const fs::path exe = bindir / fmt::format("lab{}_{}_{}", r.lab, g.binary, side);
      if (!fs::exists(exe)) {
        problem(r, fmt::format("group '{}': {} is not built", g.name, exe.filename().string()));
        continue;
      }
      // One listing per binary (each start costs a second or two), filters matched here.
      auto& names = listings[exe.string()];
      if (names.empty()) {
        auto res = run_command({exe.string(), "--gtest_list_tests"}, 120);
        std::istringstream lines(res.output);
        std::string suite;
        for (std::string line; std::getline(lines, line);) {
          if (line.empty()) continue;
          if (line[0] != ' ') suite = line;
          else names.push_back(suite + line.substr(2, line.find(' ', 2) - 2));
        }
      }
      int tests = 0;
      for (auto& name : names) tests += filter_matches(g.filter, name);
      if (tests == 0)
        problem(r, fmt::format("group '{}': filter '{}' matches no test of {}", g.name, g.filter,
                               exe.filename().string()));
      if (g.world_sizes.empty()) problem(r, fmt::format("group '{}': no world sizes", g.name));
    }
    for (auto& c : r.performance) {
      const fs::path exe = bindir / fmt::format("lab{}_bench_reference", r.lab);
      if (!fs::exists(exe)) {
        problem(r, fmt::format("performance '{}': {} is not built (cmake --build build --target {})",
                               c.name, exe.filename().string(), exe.filename().string()));
        continue;
      }
      auto res = run_command({exe.string(), "--benchmark_list_tests", "--benchmark_filter=^" + c.benchmark}, 120);
      if (res.output.find(c.benchmark) == std::string::npos)
        problem(r, fmt::format("performance '{}': no benchmark '{}' in {}", c.name, c.benchmark,
                               exe.filename().string()));
    }
    // Hidden tests may check only what the header promises: they include the lab's headers,
    // the runtime and the harness, nothing of the solution.
    std::error_code ec;
    for (auto& e : fs::directory_iterator(fs::path(opt.source) / "grading" / r.slug, ec)) {
      if (e.path().extension() != ".cpp" && e.path().extension() != ".hpp") continue;
      std::ifstream in(e.path());
      int n = 0;
      for (std::string line; std::getline(in, line);) {
        ++n;
        auto pos = line.find("#include \"");
        if (pos == std::string::npos) continue;
        std::string inc = line.substr(pos + 10);
        inc = inc.substr(0, inc.find('"'));
        const bool ok = inc.rfind("dtl/", 0) == 0 || fs::exists(lab_dir / inc) ||
                        fs::exists(e.path().parent_path() / inc);
        if (!ok || inc.find("solutions") != std::string::npos)
          problem(r, fmt::format("{}:{}: includes \"{}\" (grading tests see only the lab's headers, "
                                 "dtl/ and their own directory)", e.path().filename().string(), n, inc));
      }
    }
    // The reference passes its own lab's audit: the policy rejects no honest code that the
    // course itself writes (a new deny pattern that catches a reference fails here, in CI).
    if (has_reference) {
      std::vector<std::string> sources;
      AuditPolicy policy = policy_for(r, opt.source, sources);
      const auto objects = lab_objects(opt.build, r, "reference");
      if (objects.empty()) problem(r, "the reference's objects were not found in the build");
      for (auto& finding : audit_objects(objects, policy))
        problem(r, "the reference fails the code audit: " + finding);
    }
    std::cerr << fmt::format("lab {}: rubric checked ({} groups, {} performance checks)\n", r.lab,
                             r.tests.size(), r.performance.size());
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"dtl-grade: score labs by their rubrics (run through ./lab grade)"};
  app.add_option("--source", opt.source, "repository root (holds grading/NN_slug/rubric.json)");
  app.add_option("--build", opt.build, "build directory (holds bin/labNN_*)");
  app.add_option("--labs", opt.labs, "lab numbers to grade (default: every lab with a rubric)");
  app.add_option("--side", opt.side, "student or reference")->check(CLI::IsMember({"student", "reference"}));
  app.add_option("--json", opt.json_path, "write Gradescope results.json here");
  app.add_option("--build-logs", opt.build_logs, "directory with labNN.log build logs");
  app.add_option("--run-as", opt.run_as, "run student code as this user (when grading as root)");
  app.add_option("--timeout", opt.timeout, "seconds per mpirun job");
  app.add_option("--test-timeout", opt.test_timeout, "seconds per test (the harness watchdog)");
  app.add_option("--perf-rounds", opt.perf_rounds, "interleaved benchmark rounds per side");
  app.add_option("--perf-max-rounds", opt.perf_max_rounds,
                 "rounds per side for a result just under the bar (within 2x of it)");
  app.add_flag("!--no-perf", opt.perf, "skip performance checks");
  app.add_option("--max-world", opt.max_world, "grade world sizes up to N only (quick checks)");
  app.add_option("--only-groups", opt.only_groups, "grade test groups whose name contains TEXT");
  app.add_option("--note", opt.notes, "a line to add to the report (repeatable)");
  app.add_flag("!--no-audit", opt.audit, "skip the static audit of student code (audit.hpp)");
  app.add_option("--reference-times", opt.reference_times,
                 "JSON of each lab's reference grading time: written by --side reference, "
                 "read by --side student for the lab's time budget");
  app.add_option("--budget-min", opt.budget_min, "smallest time budget per lab (seconds)");
  app.add_option("--output-limit-mb", opt.output_limit_mb, "largest file/output a student run may write");
  app.add_option("--memory-limit-mb", opt.memory_limit_mb, "heap per process of a student run");
  app.add_flag("--all", opt.all, "grade labs whose student files are the untouched skeleton too "
               "(default: report them \"not started\" without running anything)");
  bool untouched = false;
  app.add_flag("--untouched", untouched,
               "print the labs of --labs (default: all) whose student files are the untouched "
               "skeleton, and exit (for ./lab grade, which then builds nothing for them)");
  bool stamp = false, check_stamps = false;
  app.add_flag("--stamp-skeletons", stamp, "write grading/skeletons.sha256 from the student files");
  app.add_flag("--check-skeletons", check_stamps,
               "check grading/skeletons.sha256 against the student files and exit: 1 if stale");
  bool audit_sources_only = false;
  app.add_flag("--audit-sources", audit_sources_only,
               "audit the student sources of --labs (before building them) and exit: 1 if rejected");
  bool validate = false;
  app.add_flag("--validate", validate,
               "check every rubric against the built binaries (filters match tests, points, "
               "student files, benchmarks, grading-test includes) and exit");
  std::string public_rubric;
  app.add_option("--public-rubric", public_rubric,
                 "print the student-release version of this rubric.json (public groups only)");
  bool list = false;
  app.add_flag("--list", list, "print 'NN slug file...' for every rubric and exit (for ./lab)");
  std::string check_file;
  std::vector<std::string> expects;
  app.add_option("--check", check_file, "check a results.json against --expect conditions");
  app.add_option("--expect", expects,
                 "'score|correctness|performance OP VALUE|max|..._max' or "
                 "'reason|output contains TEXT' (the grader's self-test)");
  std::string reports;
  std::vector<std::string> summary_tests;
  app.add_option("--summarize", summary_tests, "ctest entries to summarise as a table (./lab test NN)");
  app.add_option("--reports", reports, "with --summarize: directory of <entry>.json gtest reports");
  CLI11_PARSE(app, argc, argv);

  if (!check_file.empty()) return check_results(check_file, expects);
  try {
    if (stamp) {
      const int files = stamp_skeletons(opt.source);
      std::cout << fmt::format("wrote {}: {} student files\n", kSkeletonManifest, files);
      return 0;
    }
    if (check_stamps) {
      auto stale = stale_skeletons(opt.source);
      for (auto& s : stale) std::cerr << s << "\n";
      if (!stale.empty())
        std::cerr << "A skeleton changed: run ./lab stamp-skeletons and commit " << kSkeletonManifest
                  << " (./lab grade reports a lab \"not started\" when its files match it).\n";
      else
        std::cerr << kSkeletonManifest << " matches every lab's student files\n";
      return stale.empty() ? 0 : 1;
    }
    if (untouched) {
      for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
      for (auto& r : load_rubrics(opt.source, opt.labs))
        if (untouched_skeleton(r, opt.source)) std::cout << r.lab << "\n";
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  if (!public_rubric.empty()) return print_public_rubric(public_rubric);
  if (validate) return validate_rubrics(opt);
  if (audit_sources_only) {
    try {
      for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
      int bad = 0;
      for (auto& r : load_rubrics(opt.source, opt.labs)) {
        std::vector<std::string> files;
        AuditPolicy policy = policy_for(r, opt.source, files);
        for (auto& problem : audit_sources(files, policy)) {
          std::cout << "lab " << r.lab << ": " << problem << "\n";
          ++bad;
        }
      }
      return bad ? 1 : 0;
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
  }
  if (!summary_tests.empty()) return summarize(reports, summary_tests);

  if (list) {
    try {
      for (auto& r : load_rubrics(opt.source, {})) {
        std::cout << r.lab << " " << r.slug;
        for (auto& f : r.student_files) std::cout << " " << f;
        std::cout << "\n";
      }
    } catch (const std::exception& e) {
      std::cerr << e.what() << "\n";
      return 2;
    }
    return 0;
  }

  auto start = std::chrono::steady_clock::now();
  std::vector<LabResult> results;
  std::vector<Rubric> rubrics;
  std::string fatal;
  try {
    for (auto& l : opt.labs) l = fmt::format("{:02d}", std::stoi(l));
    rubrics = load_rubrics(opt.source, opt.labs);
    if (rubrics.empty()) fatal = "no rubric found for the requested labs";
    Grader grader(opt);
    for (size_t k = 0; k < rubrics.size(); ++k) {
      const Rubric& r = rubrics[k];
      const auto lab_start = std::chrono::steady_clock::now();
      if (opt.side != "student" || opt.all || !untouched_skeleton(r, opt.source))
        std::cerr << fmt::format("[{}/{}] grading lab {} ({})...\n", k + 1, rubrics.size(), r.lab,
                                 r.title) << std::flush;
      results.push_back(grader.grade(r));
      const auto& done = results.back();
      if (done.not_started) continue;  // the table says so; no progress to report
      std::cerr << fmt::format("[{}/{}] lab {}: {:.1f}/{:g} in {:.0f} s{}\n", k + 1, rubrics.size(),
                               r.lab, done.correctness + done.performance,
                               done.correctness_max + done.performance_max,
                               std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                             lab_start).count(),
                               done.reason.empty() ? "" : ": " + first_line(done.reason, 100));
    }
    grader.save_reference_times();
  } catch (const std::exception& e) {
    fatal = e.what();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string tab = table(results, opt);
  if (!fatal.empty()) tab += "grader error: " + fatal + "\n";
  for (auto& n : opt.notes) tab += n + "\n";
  std::cout << tab << std::flush;
  // Always write results.json, even when grading itself failed.
  json doc = to_gradescope(results, opt, seconds, tab);
  if (!fatal.empty()) doc["output"] = tab;
  std::ofstream(opt.json_path) << doc.dump(2) << "\n";
  std::cerr << "results: " << opt.json_path << "\n";
  return fatal.empty() ? 0 : 2;
}
