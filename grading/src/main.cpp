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
#include <set>
#include <sstream>

#include "rubric.hpp"
#include "run.hpp"

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
  bool perf = true;
  int max_world = 0;        // grade only world sizes up to this (0: all); quick regrades, self-test
  std::string only_groups;  // grade only test groups whose name contains this
  std::vector<std::string> notes;  // lines for the top of the report (e.g. ignored files)
};

struct GroupRun {
  const TestGroup* group = nullptr;
  int world = 1;
  int passed = 0, total = 0;
  double score = 0, max_score = 0;
  std::string reason;  // empty when all passed
  std::string output;
};

struct PerfResult {
  const PerfCheck* check = nullptr;
  double student = NAN, reference = NAN, ratio = NAN, score = 0;
  std::string reason, output;
};

struct LabResult {
  const Rubric* rubric = nullptr;
  std::vector<GroupRun> runs;
  std::vector<PerfResult> perf;
  std::string reason;
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
  }
  ~Grader() {
    std::error_code ec;
    fs::remove_all(reports_, ec);
  }

  LabResult grade(const Rubric& r) {
    LabResult lab;
    lab.rubric = &r;
    for (auto& g : r.tests) {
      if (!opt_.only_groups.empty() && g.name.find(opt_.only_groups) == std::string::npos) continue;
      for (int n : g.world_sizes)
        if (opt_.max_world == 0 || n <= opt_.max_world) lab.runs.push_back(run_group(r, g, n));
    }
    std::string first_reason;
    for (auto& run : lab.runs) {
      lab.correctness += run.score;
      lab.correctness_max += run.max_score;
      lab.pairs_passed += run.passed;
      lab.pairs_total += run.total;
      if (first_reason.empty() && !run.reason.empty()) first_reason = run.reason;
    }
    const bool correct = lab.pairs_total > 0 && lab.pairs_passed == lab.pairs_total;
    for (auto& c : r.performance) {
      lab.performance_max += c.points;
      PerfResult p = correct ? (opt_.perf ? run_perf(r, c) : skipped(c, "skipped (--no-perf)"))
                             : skipped(c, "skipped: performance counts only when every test passes");
      lab.performance += p.score;
      if (first_reason.empty() && !p.reason.empty() && correct && opt_.perf) first_reason = p.reason;
      lab.perf.push_back(p);
    }
    lab.reason = first_reason;
    return lab;
  }

 private:
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

  // Commands run as the unprivileged user when grading as root (Gradescope).
  std::vector<std::string> wrap(std::vector<std::string> cmd) const {
    if (opt_.run_as.empty()) return cmd;
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

  // The tests the group must run, asked before running anything (the single-process list mode
  // of the test main), so a crash cannot hide how many tests there were.
  std::vector<std::string> list_tests(const std::string& exe, const std::string& filter) {
    auto res = run_command(wrap({exe, "--gtest_list_tests", "--gtest_filter=" + filter}), 120,
                           mpi_env());
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
    return names;
  }

  GroupRun run_group(const Rubric& r, const TestGroup& g, int n) {
    GroupRun run;
    run.group = &g;
    run.world = n;
    run.max_score = g.points / static_cast<double>(g.world_sizes.size());  // of the full rubric
    const std::string exe = bin(r, g.binary, opt_.side);
    if (!fs::exists(exe)) {
      run.total = 1;
      run.reason = opt_.side == "student" ? "does not compile" : "reference binary missing";
      run.output = fmt::format("{} was not built.\n{}", fs::path(exe).filename().string(), build_log(r));
      return run;
    }
    auto expected = list_tests(exe, g.filter);
    run.total = std::max<int>(1, static_cast<int>(expected.size()));
    std::string report = fmt::format("{}/lab{}_{}_n{}_{}.json", reports_, r.lab, g.binary, n, counter_++);
    if (!opt_.run_as.empty()) {
      // The run may write its report here, nowhere else of the grader's.
      (void)chown(reports_.c_str(), static_cast<uid_t>(uid_), static_cast<gid_t>(gid_));
    }
    const std::string watchdog_report = report + ".watchdog";
    std::vector<std::string> cmd = mpirun(n);
    for (std::string a : {exe, "--gtest_filter=" + g.filter, "--gtest_output=json:" + report,
                          fmt::format("--dtl_timeout={}", opt_.test_timeout)})
      cmd.push_back(a);
    int timeout = g.timeout > 0 ? g.timeout : opt_.timeout;
    auto env = mpi_env();
    env.push_back("DTL_WATCHDOG_REPORT=" + watchdog_report);  // the watchdog's findings, as JSON
    auto res = run_command(wrap(cmd), timeout, env, reports_);
    std::ifstream watchdog_in(watchdog_report);
    const json watchdog = json::parse(watchdog_in, nullptr, false);
    std::remove(watchdog_report.c_str());
    run.output = tail(res.output, 60);

    std::map<std::string, std::string> failed;  // test -> first failure message
    std::set<std::string> passed;
    std::ifstream in(report);
    json j = json::parse(in, nullptr, false);
    std::remove(report.c_str());
    if (!j.is_discarded() && j.contains("testsuites")) {
      for (auto& suite : j["testsuites"])
        for (auto& t : suite.value("testsuite", json::array())) {
          std::string name = suite.value("name", "") + "." + t.value("name", "");
          if (t.contains("failures") && !t["failures"].empty())
            failed[name] = t["failures"][0].value("failure", "failed");
          else if (t.value("result", "") == "COMPLETED" || t.value("result", "") == "SKIPPED")
            passed.insert(name);
        }
    }
    // A clean exit is required too: a report that says "passed" from a job that crashed,
    // hung or exited non-zero counts for nothing.
    const bool clean = !res.timed_out && res.exit_code == 0;
    for (auto& name : expected)
      if (clean && passed.count(name)) ++run.passed;
    if (expected.empty() && clean && failed.empty() && !passed.empty()) run.passed = run.total;
    run.score = run.max_score * run.passed / run.total;

    if (run.passed == run.total) return run;
    if (res.timed_out) {
      run.reason = fmt::format("timed out after {} s at n={} (a hang: see the watchdog's report)",
                               timeout, n);
    } else if (!watchdog.is_discarded() && watchdog.contains("summary")) {
      // Who waits where, who is missing: "ranks [0,1]: waiting in all_reduce #2 on comm ...".
      std::string states;
      for (auto& entry : watchdog["summary"]) {
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
    } else if (j.is_discarded()) {
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
    auto res = run_command(wrap(cmd), opt_.timeout, mpi_env(), reports_);
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
    if (!fs::exists(mine) || !fs::exists(ref)) return skipped(c, "benchmark binary missing");
    // Interleaved (A B A B ...), so both sides see the same machine; medians per side.
    std::vector<double> a, b;
    for (int i = 0; i < opt_.perf_rounds; ++i) {
      a.push_back(bench_once(mine, c, p.output));
      b.push_back(bench_once(ref, c, p.output));
    }
    auto median = [](std::vector<double> v) -> double {
      v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
      if (v.empty()) return std::nan("");
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
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
                            opt_.perf_rounds, p.ratio, c.min_ratio);
    if (p.score == 0)
      p.reason = fmt::format("{}: {:.2f} x the reference, needs {:.2f}", c.name, p.ratio, c.min_ratio);
    return p;
  }

  Options opt_;
  std::string reports_;
  int uid_ = -1, gid_ = -1;
  int counter_ = 0;
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
                {"score", std::round(run.score * 100) / 100},
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
                       fmt::format("{}/{}", lab.pairs_passed, lab.pairs_total),
                       fmt::format("{:.1f}/{:.0f}", lab.correctness, lab.correctness_max),
                       fmt::format("{:.0f}/{:.0f}", lab.performance, lab.performance_max),
                       fmt::format("{:.1f}/{:.0f}", t, m), lab.reason.empty() ? "ok" : lab.reason);
    for (auto& p : lab.perf)
      if (!std::isnan(p.student))
        out += fmt::format("      performance {}: yours {:.4g}, reference {:.4g} ({:.2f} x, needs {:.2f})\n",
                           p.check->name, p.student, p.reference, p.ratio, p.check->min_ratio);
  }
  out += fmt::format("{:<5} {:<44} {:>9} {:>13} {:>11} {:>13}\n", "", "total", "", "", "",
                     fmt::format("{:.1f}/{:.0f}", got, max));
  out += fmt::format("graded: the {} build\n", opt.side == "student" ? "student" : "reference (--solutions)");
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
  app.add_flag("!--no-perf", opt.perf, "skip performance checks");
  app.add_option("--max-world", opt.max_world, "grade world sizes up to N only (quick checks)");
  app.add_option("--only-groups", opt.only_groups, "grade test groups whose name contains TEXT");
  app.add_option("--note", opt.notes, "a line to add to the report (repeatable)");
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
    for (auto& r : rubrics) {
      std::cerr << fmt::format("grading lab {} ({})...\n", r.lab, r.title);
      results.push_back(grader.grade(r));
    }
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
