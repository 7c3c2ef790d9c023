// Grading one lab (grader.hpp): the stages in order, and the verdict from what the grader
// observed itself: exit statuses, the trusted driver's report, its own clock, and the test list
// it obtained from the reference before running anything.
#include "grader.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "skeleton.hpp"
#include "tools.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtl::grade {

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
    // A lab's given frame (FRAME sources) is compiled into the same library but is the course's
    // code, not the submission's: only the student files are audited.
    const bool student_file = std::any_of(r.student_files.begin(), r.student_files.end(),
                                          [&](const std::string& f) { return base == f + ".o"; });
    if (p.find(objdir) != std::string::npos && student_file) objects.push_back(p);
  }
  return objects;
}

AuditPolicy policy_for(const Rubric& r, const std::string& source,
                       std::vector<std::string>& files) {
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

Grader::Grader(Options o) : opt_(std::move(o)) {
  // Runs happen in the report directory: every path must be absolute.
  opt_.build = fs::absolute(opt_.build).string();
  if (!opt_.build_logs.empty()) opt_.build_logs = fs::absolute(opt_.build_logs).string();
  char tmpl[] = "/tmp/dtl-grade-XXXXXX";
  if (!mkdtemp(tmpl)) throw std::runtime_error("cannot create the grader's report directory");
  reports_ = tmpl;
  if (!opt_.run_as.empty()) {
    passwd* pw = getpwnam(opt_.run_as.c_str());
    if (!pw) throw std::runtime_error("--run-as: no user '" + opt_.run_as + "'");
    if (geteuid() != 0) throw std::runtime_error("--run-as needs root (it switches to that user)");
    student_.uid = static_cast<int>(pw->pw_uid);
    student_.gid = static_cast<int>(pw->pw_gid);
  }
  if (!opt_.reference_times.empty()) load_reference_times();
  if (opt_.sandbox && !fs::exists(fs::path(opt_.build) / "bin" / "dtl-sandbox"))
    throw std::runtime_error("dtl-sandbox is not built (cmake --build " + opt_.build +
                             " --target dtl-sandbox)");
  if (opt_.sandbox) sandbox_ = probe_sandbox();
  namespaces_ = pid_namespaces_available();
  jobs_ = std::make_unique<JobRunner>(opt_, student_, reports_, std::vector<std::string>{});
  perf_ = std::make_unique<PerfRunner>(opt_, *jobs_);
  adopt_orphans();  // without PID namespaces: a daemon cannot escape to init
                    // (after_student_command)
}

Grader::~Grader() {
  if (keep_job_dirs()) {
    fmt::print(stderr, "grader: job directories kept in {}\n", reports_);
    return;
  }
  std::error_code ec;
  fs::remove_all(reports_, ec);
}

std::string Grader::isolation() const {
  if (!student()) return "graded: the reference solutions, in-process (trusted code)";
  std::string out = "student code ran ";
  out += opt_.sandbox ? "in the sandbox (" + sandbox_.describe() + ")"
                      : "WITHOUT the sandbox (--no-sandbox)";
  out +=
      student_.dropped() ? fmt::format(", as user {}", opt_.run_as) : ", as the grader's own user";
  out += !namespaces_        ? ", its leftovers killed after each job"
         : geteuid() == 0 ? ", one PID namespace per job"
                          : ", one PID namespace per job (in a user namespace of the grader's user)";
  return out;
}

double Grader::seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// After every student command, without PID namespaces: nothing of the student's may outlive it
// (a setsid daemon that would stop the reference's benchmark or rewrite results.json later).
void Grader::after_student_command() {
  if (!student()) return;
  if (const int n = kill_descendants(); n > 0)
    std::cerr << fmt::format("grader: killed {} process(es) a student command left running\n", n);
}

bool Grader::driver_for(const Rubric& r, const std::string& binary) const {
  if (!student() || opt_.verdict == "in-process") return false;
  return fs::exists(bin(r, binary, "reference"));
}

void Grader::load_reference_times() {
  std::ifstream in(opt_.reference_times);
  json j = json::parse(in, nullptr, false);
  if (!j.is_object()) return;
  for (auto& [lab, v] : j.items()) {
    if (v.is_number()) reference_seconds_[lab] = v.get<double>();
    if (lab == "tests" && v.is_object())
      for (auto& [test, s] : v.items())
        if (s.is_number()) reference_test_seconds_[test] = s.get<double>();
  }
}

void Grader::save_reference_times() const {
  if (student() || opt_.reference_times.empty()) return;
  json j = json::object();
  std::ifstream in(opt_.reference_times);
  json old = json::parse(in, nullptr, false);
  if (old.is_object()) j = old;
  for (auto& [lab, seconds] : reference_seconds_) j[lab] = seconds;
  for (auto& [test, seconds] : reference_test_seconds_) j["tests"][test] = seconds;
  std::ofstream(opt_.reference_times) << j.dump(2) << "\n";
}

GroupRun Grader::not_run(const TestGroup& g, int n, const std::string& reason,
                         const std::string& output) {
  GroupRun run;
  run.group = &g;
  run.world = n;
  run.max_score = g.points_at(n);
  run.total = 1;
  run.reason = reason;
  run.output = output;
  return run;
}

std::string Grader::bin(const Rubric& r, const std::string& kind, const std::string& side) const {
  return (fs::path(opt_.build) / "bin" / fmt::format("lab{}_{}_{}", r.lab, kind, side)).string();
}

std::string Grader::build_log(const Rubric& r) const {
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
  return plain(out.empty() ? tail(log, 30) : out);
}

// ------------------------------------------------------------------ the audit stage

// The shared libraries `binary` loads, read from ELF dynamic sections (objdump -p), never by
// running it or its loader: its NEEDED names, looked up in its RUNPATH (or RPATH, $ORIGIN
// expanded), LD_LIBRARY_PATH and the system's library directories, then the same for each library
// found, breadth first. What a student release has to go by: it has no reference binary to run
// ldd on, only the student's own, built by ./lab from their sources.
static std::vector<std::string> elf_libraries(const std::string& binary) {
  static const std::vector<std::string> system_dirs = {
      "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
      "/usr/lib", "/usr/local/lib"};
  std::vector<std::string> env_dirs;
  if (const char* ld = std::getenv("LD_LIBRARY_PATH")) {
    std::istringstream in(ld);
    for (std::string d; std::getline(in, d, ':');)
      if (!d.empty()) env_dirs.push_back(d);
  }
  std::vector<std::string> found, queue = {binary};
  std::set<std::string> seen;
  for (size_t next = 0; next < queue.size() && next < 400; ++next) {
    const std::string file = queue[next];
    std::string dump;
    try {
      dump = run_tool({"objdump", "-p", file});
    } catch (const std::exception&) {
      continue;
    }
    std::vector<std::string> needed, runpath;
    std::istringstream lines(dump);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string key, value;
      words >> key >> value;
      if (key == "NEEDED") needed.push_back(value);
      if (key == "RUNPATH" || key == "RPATH") {
        std::istringstream dirs(value);
        for (std::string d; std::getline(dirs, d, ':');) {
          if (d.rfind("$ORIGIN", 0) == 0) d = fs::path(file).parent_path().string() + d.substr(7);
          if (!d.empty()) runpath.push_back(d);
        }
      }
    }
    for (const auto& name : needed) {
      if (!seen.insert(name).second) continue;
      const std::vector<std::string>* search[] = {&runpath, &env_dirs, &system_dirs};
      for (const auto* dirs : search) {
        auto dir = std::find_if(dirs->begin(), dirs->end(), [&](const std::string& d) {
          return fs::exists(fs::path(d) / name);
        });
        if (dir == dirs->end()) continue;
        const std::string path = (fs::path(*dir) / name).lexically_normal().string();
        found.push_back(path);
        queue.push_back(path);
        break;
      }
    }
  }
  return found;
}

// The shared libraries the tests load, from the reference's binary (never run student code
// to learn something about it), or in a student release, which has no reference, from the
// student's binary's dynamic section (elf_libraries): all of them (the sandbox lets the tests
// read their directories), and those whose functions the tests, the harness and the runtime call
// (the audit checks that no weak definition replaces theirs; LibTorch alone pulls in ~300 others
// that no test reaches).
std::pair<std::vector<std::string>, std::vector<std::string>> Grader::test_libraries(
    const Rubric& r) const {
  std::vector<std::string> all, called;
  static const std::regex relevant(
      R"(/lib((torch|c10|stdc\+\+|mpi|open-pal|open-rte|gtest|gmock|fmt|benchmark|dtl)[^/]*|c|m|gcc_s)\.so[^/]*$)");
  auto keep = [&](const std::string& path) {
    all.push_back(path);
    if (path.rfind(opt_.build, 0) == 0 || std::regex_search(path, relevant)) called.push_back(path);
  };
  const std::string ref = bin(r, "test", "reference");
  if (!fs::exists(ref)) {
    const std::string mine = bin(r, "test", "student");
    if (fs::exists(mine))
      for (const auto& path : elf_libraries(mine)) keep(path);
    return {all, called};
  }
  try {
    std::istringstream ldd(run_tool({"ldd", ref}));
    for (std::string line; std::getline(ldd, line);) {
      auto arrow = line.find("=> /");
      if (arrow == std::string::npos) continue;
      std::string path = line.substr(arrow + 3);
      keep(path.substr(0, path.find(" (")));
    }
  } catch (const std::exception&) {
  }
  return {all, called};
}


std::string Grader::audit(const Rubric& r, LabResult& lab) {
  std::vector<std::string> sources;
  AuditPolicy policy = policy_for(r, opt_.source, sources);
  policy.as = student_;
  const std::vector<std::string> objects = lab_objects(opt_.build, r, "student");
  policy.libraries = test_libraries(r).second;
  AuditResult result;
  std::vector<std::string> problems;
  try {
    result = audit_sources(sources, policy);
    // Sources rejected outright are never built (./lab stops before the build): the objects in
    // the build directory are then an earlier build's (a scratch build reused for another
    // submission), not this code's, and are not audited.
    if (result.rejections(true, true, true).empty()) {
      if (objects.empty() && fs::exists(bin(r, "test", "student")))
        problems.push_back("the student objects were not found in the build directory");
      result.add(audit_objects(objects, policy));
    }
  } catch (const std::exception& e) {
    problems.push_back(std::string("the audit could not run: ") + e.what());
  }
  // What the sandbox or the driver makes harmless is a note, if this run has that mechanism.
  const bool driver = driver_for(r, "test");
  const bool seccomp = opt_.sandbox && sandbox_.seccomp,
             landlock = opt_.sandbox && sandbox_.landlock_abi > 0;
  for (auto& p : result.rejections(seccomp, landlock, driver)) problems.push_back(p);
  lab.integrity = result.notes(seccomp, landlock, driver);
  if (problems.empty()) return "";
  lab.audit_output =
      "The grader checks what your code calls and defines before running it (see "
      "grading/README.md, \"What the grader allows\"). Found:\n";
  for (auto& pr : problems) lab.audit_output += "  " + pr + "\n";
  return fmt::format("rejected by the code audit: {}{}", problems.front(),
                     problems.size() > 1 ? fmt::format(" (and {} more)", problems.size() - 1) : "");
}

// ------------------------------------------------------------------ runs and verdicts

// Every test of a binary, asked once before running anything (the single-process list mode of
// the test main), from the reference's binary when there is one: the student's process cannot
// shrink the list (a rewritten --gtest_filter runs fewer tests, and every missing test counts as
// failed), and no student code runs to produce it.
//
// A trusted binary's list is also kept on disk, in the build's grade-cache/, under the binary's
// name, size and modification time: grading a class (or the self-test's submissions) asks the
// same reference binary once per submission, and each asking loads LibTorch (0.8 s of CPU).
// A rebuilt binary has another time, so another entry. The student's binaries are asked anew.
const std::vector<std::string>& Grader::listing(const std::string& exe) {
  auto cached = listings_.find(exe);
  if (cached != listings_.end()) return cached->second;
  const bool untrusted = student() && exe.find("_student") != std::string::npos;
  fs::path on_disk;
  if (!untrusted) {
    std::error_code size_ec, time_ec;
    const auto size = fs::file_size(exe, size_ec);
    const auto time =
        static_cast<uint64_t>(fs::last_write_time(exe, time_ec).time_since_epoch().count());
    if (!size_ec && !time_ec) {
      on_disk = fs::path(opt_.build) / "grade-cache" /
                fmt::format("{}-{}-{:x}.tests", fs::path(exe).filename().string(), size, time);
      std::ifstream in(on_disk);
      std::vector<std::string> names;
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) names.push_back(line);
      if (!names.empty()) return listings_[exe] = names;
    }
  }
  std::vector<std::string> cmd;
  std::string dir;
  if (untrusted) {
    dir = jobs_->job_dir();
    cmd = jobs_->sandbox_prefix(dir, false);
  }
  cmd.push_back(exe);
  cmd.push_back("--gtest_list_tests");
  auto env = jobs_->mpi_env();
  auto res = untrusted ? run_command(cmd, 120, env, dir, jobs_->student_limits(dir),
                                     jobs_->student_launch())
                       : run_command(cmd, 120, env);
  if (untrusted) {
    after_student_command();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  const std::vector<std::string> names = gtest_names(res.output);
  if (!on_disk.empty() && res.exit_code == 0 && !names.empty()) {
    // Written whole, then renamed: a grading beside this one reads all of it or nothing.
    std::error_code ec;
    fs::create_directories(on_disk.parent_path(), ec);
    const fs::path tmp = on_disk.string() + fmt::format(".{}", ::getpid());
    {
      std::ofstream out(tmp);
      for (const auto& n : names) out << n << "\n";
    }
    fs::rename(tmp, on_disk, ec);
    if (ec) fs::remove(tmp, ec);
  }
  return listings_[exe] = names;
}

// The harness watchdog's limit for a job: the grader's default, or 5x the slowest of its tests
// when the reference took that long (lab 20's trainer), scaled up when the machine is busier
// than it has cores (other gradings beside this one): a reference must never hit it.
int Grader::test_timeout(const Rubric& r, const std::vector<std::string>& tests) const {
  double t = opt_.test_timeout;
  for (const auto& name : tests)
    if (auto it = reference_test_seconds_.find(r.lab + "/" + name);
        it != reference_test_seconds_.end())
      t = std::max(t, 5 * it->second);
  double load[1] = {0};
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  if (getloadavg(load, 1) == 1 && load[0] > cores) t *= std::min(4.0, load[0] / cores);
  return static_cast<int>(std::ceil(t));
}

Job Grader::run_job(const Rubric& r, const std::string& binary, const std::string& filter, int n,
                    int timeout, const std::vector<std::string>& tests, bool budget_bound) {
  JobPlan plan;
  plan.worker = bin(r, binary, opt_.side);
  plan.driver = driver_for(r, binary) ? bin(r, binary, "reference") : "";
  plan.filter = filter;
  plan.world = n;
  plan.timeout = timeout;
  plan.test_timeout = test_timeout(r, tests);
  // The job's own limit leaves room for every test's watchdog, unless the lab's time budget set
  // it: then the budget wins and the watchdog fits inside it (a hanging test still ends with
  // the harness's diagnosis rather than the job's kill).
  const int own_watchdog = plan.test_timeout;
  if (budget_bound)
    plan.test_timeout = std::max(1, std::min(plan.test_timeout, plan.timeout - 5));
  else
    plan.timeout = std::max(plan.timeout, plan.test_timeout + 30);
  plan.untrusted = student();
  plan.processes = r.sandbox_processes;
  Job job = jobs_->run(plan);
  if (budget_bound) {
    job.budget_note = budget_used_up(r);
    job.watchdog_cut_by_budget = plan.test_timeout < own_watchdog;
  }
  if (plan.untrusted) after_student_command();
  // What the driver could check on observed values, and what it could not.
  const json counts =
      job.summary.is_object() ? job.summary.value("tests", json::object()) : json::object();
  for (auto& [name, c] : counts.items()) {
    if (!job.passed.count(name)) continue;
    if (c.value("computed", 0) > 0)
      ++observed_tests_;
    else
      ++in_process_tests_;
    if (c.value("measured", 0) > 0) ++measured_tests_;
  }
  // Reference runs record how long each test takes (the watchdog's base for students).
  if (!student() && job.report.is_object())
    for (auto& suite : job.report.value("testsuites", json::array()))
      for (auto& t : suite.value("testsuite", json::array())) {
        const std::string time = t.value("time", "0s");
        const std::string key = r.lab + "/" + suite.value("name", "") + "." + t.value("name", "");
        reference_test_seconds_[key] =
            std::max(reference_test_seconds_[key], std::atof(time.c_str()));
      }
  return job;
}

// Per-test results count only from a run that ended by itself: exit 0, or gtest's exit 1 ("some
// test failed") with a report that lists every expected test. With a driver, that run is the
// driver's: the worker may crash or hang, the driver still judges each test on what the worker
// recorded before.
bool Grader::trusted(const Job& job, const std::vector<std::string>& expected) {
  size_t reported = 0;
  for (auto& name : expected)
    reported += job.passed.count(name) + job.failed.count(name) + job.skipped.count(name);
  const bool complete = !expected.empty() && reported == expected.size();
  const RunResult& res = job.deciding();
  return !res.timed_out && !res.output_limited && !res.disk_limited && res.signal == 0 &&
         (res.exit_code == 0 || (res.exit_code == 1 && complete));
}

GroupRun Grader::score_group(const TestGroup& g, int n, const std::vector<std::string>& expected,
                             const Job& job) {
  GroupRun run;
  run.group = &g;
  run.world = n;
  run.max_score = g.points_at(n);  // of the full rubric
  run.total = std::max<int>(1, static_cast<int>(expected.size()));
  const RunResult& res = job.worker;
  const bool ok = trusted(job, expected);
  std::map<std::string, std::string> failed;  // this group's failures only
  for (auto& name : expected)
    if (auto it = job.failed.find(name); it != job.failed.end()) failed.insert(*it);
  // The test the watchdog stopped, if it is one of this group's.
  const std::string hung = job.watchdog.is_object() ? job.watchdog.value("test", "") : "";
  run.hung = !hung.empty() && std::find(expected.begin(), expected.end(), hung) != expected.end();
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
  if (expected.empty() && ok && job.deciding().exit_code == 0 && job.failed.empty() &&
      !job.passed.empty())
    run.passed = run.total;
  if (!expected.empty() && ok && skips > 0) run.total -= skips;
  run.score = run.total > 0 ? run.max_score * run.passed / run.total : 0.0;
  // Every test that ran failed with "not implemented": the grader need not try larger sizes.
  run.not_implemented = ok && run.total > 0 && not_implemented == run.total;
  if (run.total == 0) {
    run.reason = fmt::format(
        "every test of this group skips itself at n={}: nothing was "
        "checked (a rubric error: drop that world size)",
        n);
    return run;
  }
  if (run.passed == run.total) return run;
  // The first reason that applies, most specific first.
  std::string hang_state;
  if (job.watchdog.is_object() && job.watchdog.contains("summary")) {
    for (auto& entry : job.watchdog["summary"]) {
      std::string ranks;
      for (auto& rk : entry["ranks"])
        ranks += (ranks.empty() ? "" : ",") + std::to_string(rk.get<int>());
      hang_state += fmt::format("{}ranks [{}]: {}", hang_state.empty() ? "" : "; ", ranks,
                                entry.value("state", "?"));
    }
  }
  if (res.output_limited) {
    run.reason = fmt::format("stopped at n={}: its output reached the limit of {} MiB", n,
                             opt_.output_limit_mb);
  } else if (res.disk_limited) {
    run.reason = fmt::format("stopped at n={}: it wrote more than {} MiB", n, opt_.disk_limit_mb);
  } else if (run.hung && !hang_state.empty()) {
    run.reason = fmt::format("hang at n={} in {} stopped by the watchdog: {}", n, hung,
                             first_line(hang_state, 300));
    run.stalled = true;
  } else if (res.timed_out && (!ok || !job.split)) {
    run.reason = fmt::format("timed out after {} s at n={} (a hang: see the watchdog's report)",
                             job.timeout, n);
    run.stalled = true;
  } else if (!hang_state.empty() && !ok) {
    run.reason =
        fmt::format("hang at n={} stopped by the watchdog: {}", n, first_line(hang_state, 300));
    run.stalled = true;
  } else if (const std::string death = signal_death_line(res.output); !death.empty()) {
    run.reason = fmt::format("crashed at n={}: {}", n, first_line(death));
  } else if (!failed.empty()) {
    for (auto& [name, msg] : failed) {
      std::string ni = not_implemented_reason(msg);
      if (!ni.empty()) {
        run.reason = ni;
        break;
      }
    }
    if (run.reason.empty()) {
      // The first failure's own message, without its file:line: what the student reads first.
      const std::string& msg = failed.begin()->second;
      const size_t nl = msg.find('\n');
      const std::string body = nl == std::string::npos ? msg : msg.substr(nl + 1);
      run.reason = fmt::format("{} of {} tests fail at n={}; first: {}: {}", run.total - run.passed,
                               run.total, n, failed.begin()->first, gist(body, 300));
    }
  } else if (ok && !missing.empty()) {
    run.reason = fmt::format(
        "{} of {} expected tests did not run at n={} (first: {}); a test "
        "that does not run counts as failed",
        missing.size(), run.total, n, missing.front());
  } else if (job.report.is_discarded()) {
    const RunResult& d = job.deciding();
    run.reason = fmt::format("no test report at n={} (exit code {}{}): the job died before the end",
                             n, d.exit_code, d.signal ? fmt::format(", signal {}", d.signal) : "");
  } else {
    run.reason = fmt::format("exit code {} at n={} although the report shows no failure",
                             job.deciding().exit_code, n);
  }
  // A run that the rest of the lab's budget stopped (the job's limit, or a watchdog it
  // shortened) says so, whatever the watchdog saw.
  if (!job.budget_note.empty() && ((run.hung && job.watchdog_cut_by_budget) || res.timed_out))
    run.reason += fmt::format(" ({})", job.budget_note);
  // Each failing test once, with its own failure messages (already one per check, not per rank).
  std::string details;
  for (auto& [name, msg] : failed) details += fmt::format("FAILED {} (n={}):\n{}\n", name, n, msg);
  if (failed.empty() || !ok)
    details += "---- output of the run (tail) ----\n" + plain(tail(res.output, 40));
  run.output = details;
  return run;
}

// The rows of `groups` (indices into r.tests, all of one binary) at world size n. One job runs
// all their tests: a process start per binary and size, not per group. When that job does not
// end by itself (a crash, a hang, the output cap), each group runs again on its own: one group's
// crash must not cost the others their points.
std::vector<GroupRun> Grader::run_groups(const Rubric& r, const std::string& binary,
                                         const std::vector<size_t>& groups, int n,
                                         double seconds_left) {
  std::vector<GroupRun> rows;
  const std::string exe = bin(r, binary, opt_.side);
  if (!fs::exists(exe)) {
    for (size_t i : groups) {
      GroupRun run = not_run(
          r.tests[i], n, student() ? "does not compile" : "reference binary missing",
          fmt::format("{} was not built.\n{}", fs::path(exe).filename().string(), build_log(r)));
      rows.push_back(run);
    }
    return rows;
  }
  const std::string ref = bin(r, binary, "reference");
  const auto& all = listing(student() && fs::exists(ref) ? ref : exe);
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
  // A job's limit within what is left of the lab's budget (seconds_left < 0: no budget).
  auto bound = [&](int t, double left) {
    return left >= 0 && t > static_cast<int>(left) + 1;
  };
  auto clamp = [&](int t) {
    return seconds_left >= 0 ? std::max(1, std::min(t, static_cast<int>(seconds_left) + 1)) : t;
  };
  const auto start = Clock::now();
  std::optional<Job> together;  // the job of all the groups, when it did not end by itself
  if (groups.size() > 1 && !union_tests.empty()) {
    std::string filter;
    for (auto& name : union_tests) filter += (filter.empty() ? "" : ":") + name;
    const int t = std::min(timeout, 2 * opt_.timeout);
    Job job = run_job(r, binary, filter, n, clamp(t), union_tests, bound(t, seconds_left));
    const bool worker_ended = !job.worker.timed_out && !job.worker.output_limited &&
                              !job.worker.disk_limited && job.worker.signal == 0 &&
                              (job.worker.exit_code == 0 || job.worker.exit_code == 1);
    if (trusted(job, union_tests) && worker_ended) {
      for (size_t k = 0; k < groups.size(); ++k)
        rows.push_back(score_group(r.tests[groups[k]], n, expected[k], job));
      return rows;
    }
    together = std::move(job);
  }
  // The test the watchdog stopped in the job of all groups, if any.
  const std::string hung_test = together && together->watchdog.is_object()
                                    ? together->watchdog.value("test", "")
                                    : std::string();
  for (size_t k = 0; k < groups.size(); ++k) {
    const TestGroup& g = r.tests[groups[k]];
    // The group that hung that job is scored on it: running it again alone would only wait out
    // the same watchdog a second time.
    if (!hung_test.empty() &&
        std::find(expected[k].begin(), expected[k].end(), hung_test) != expected[k].end()) {
      rows.push_back(score_group(g, n, expected[k], *together));
      continue;
    }
    const double left = seconds_left < 0 ? -1 : seconds_left - seconds_since(start);
    int t = g.timeout > 0 ? g.timeout : opt_.timeout;
    const bool budget_bound = bound(t, left);
    if (seconds_left >= 0) t = std::max(1, std::min(t, static_cast<int>(left) + 1));
    Job job = run_job(r, binary, g.filter, n, t, expected[k], budget_bound);
    rows.push_back(score_group(g, n, expected[k], job));
  }
  return rows;
}

std::string Grader::budget_used_up(const Rubric& r) {
  return fmt::format("time budget of {:.0f} s for lab {} used up (the reference needs {:.0f} s)",
                     budget_, r.lab, reference_seconds_[r.lab]);
}

PerfResult Grader::skipped(const PerfCheck& c, const std::string& why) {
  PerfResult p;
  p.check = &c;
  p.reason = why;
  return p;
}

// ------------------------------------------------------------------ one lab

LabResult Grader::grade(const Rubric& r) {
  LabResult lab;
  lab.rubric = &r;
  observed_tests_ = in_process_tests_ = measured_tests_ = 0;
  const auto lab_start = Clock::now();
  // A time budget for the whole lab, from the reference's own time when known: a submission
  // that sleeps just under every timeout cannot keep the grader busy for hours.
  budget_ = -1;
  if (student() && reference_seconds_.count(r.lab))
    budget_ =
        std::max(opt_.budget_min, 5 * reference_seconds_[r.lab] * (driver_for(r, "test") ? 2 : 1));
  // An untouched skeleton scores 0 (CI's skeleton check proves it): nothing to build or run.
  std::string not_started;
  if (student() && !opt_.all && untouched_skeleton(r, opt_.source))
    not_started = fmt::format(
        "not started: the lab {} files are the untouched skeleton "
        "(./lab grade --all runs its tests anyway)",
        r.lab);
  std::string rejected;
  // The sandbox reads the tests' shared libraries, audited or not (--no-audit).
  if (student()) jobs_->set_libraries(test_libraries(r).first);
  if (student() && opt_.audit && not_started.empty()) rejected = audit(r, lab);
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
  std::set<size_t> unimplemented;         // the groups stopped as "not implemented"
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
          rows[{i, n}] = not_run(g, n, budget_used_up(r), "");
        } else {
          here.push_back(i);
        }
      }
      if (here.empty()) continue;
      const double left = budget_ < 0 ? -1 : budget_ - seconds_since(lab_start);
      auto runs = run_groups(r, binary, here, n, left);
      for (size_t k = 0; k < here.size(); ++k) {
        if (runs[k].not_implemented) {
          stopped[here[k]] =
              fmt::format("{} (at n={}: larger world sizes not run)", runs[k].reason, n);
          unimplemented.insert(here[k]);
        }
        // A hang is recognised once: a group that hung at n is not run at larger n, where it
        // would wait out its watchdog again at every size.
        if (runs[k].stalled)
          stopped[here[k]] = fmt::format(
              "not run after its hang at n={} (a group that hangs is not run at larger world "
              "sizes): {}",
              n, first_line(runs[k].reason, 200));
        rows[{here[k], n}] = runs[k];
      }
    }
    if (binary == "test" && lab_stopped.empty()) {
      size_t public_groups = 0, unimplemented_public = 0;
      for (size_t i : selected)
        if (r.tests[i].binary == "test") {
          ++public_groups;
          unimplemented_public += unimplemented.count(i);
        }
      if (public_groups > 0 && unimplemented_public == public_groups)
        lab_stopped =
            "not implemented: every public test fails \"not implemented\", so the "
            "hidden tests were not run";
    }
  }
  for (size_t i : selected)
    for (int n : r.tests[i].world_sizes)
      if (auto it = rows.find({i, n}); it != rows.end()) lab.runs.push_back(it->second);
  if (!student() && !opt_.reference_times.empty())
    reference_seconds_[r.lab] = seconds_since(lab_start);
  std::string first_reason;
  for (auto& run : lab.runs) {
    lab.correctness += run.score;
    lab.correctness_max += run.max_score;
    lab.pairs_passed += run.passed;
    lab.pairs_total += run.total;
    if (first_reason.empty() && !run.reason.empty()) first_reason = run.reason;
  }
  const bool correct =
      lab.pairs_total > 0 && lab.pairs_passed == lab.pairs_total && rejected.empty();
  for (auto& c : r.performance) {
    PerfResult p;
    if (!correct)
      p = skipped(c, "skipped: performance counts only when every test passes");
    else if (!opt_.perf)
      p = skipped(c, "skipped (--no-perf)");
    else
      p = perf_->run(c, bin(r, "bench", opt_.side), bin(r, "bench", "reference"), student());
    if (student()) after_student_command();
    lab.performance += p.score;
    lab.performance_max += p.unmeasured ? 0 : c.points;
    if (first_reason.empty() && !p.reason.empty() && correct && opt_.perf) first_reason = p.reason;
    lab.perf.push_back(p);
  }
  lab.reason = first_reason;
  if (!not_started.empty()) {
    lab.reason = "not started (untouched skeleton)";
    lab.not_started = true;
  }
  if (!lab_stopped.empty() || (!unimplemented.empty() && unimplemented.size() == selected.size()))
    lab.reason += " (every test \"not implemented\": grading stopped at the smallest world size)";
  // How the verdict was reached, for the table.
  if (!student()) {
    lab.verdict = "reference, in-process";
  } else if (!driver_for(r, "test")) {
    lab.verdict = "in-process (no reference here: the course's autograder decides)";
  } else if (observed_tests_ + in_process_tests_ == 0) {
    lab.verdict = "driver";
  } else {
    lab.verdict = fmt::format(
        "driver: {} passing test(s) checked on observed values{}{}", observed_tests_,
        in_process_tests_ ? fmt::format(", {} on in-process checks only", in_process_tests_) : "",
        measured_tests_ ? fmt::format(", {} also on in-process measurements", measured_tests_)
                        : "");
    if (!r.observed)
      lab.verdict += "; this lab's tests are not yet converted to observe every value";
  }
  return lab;
}

}  // namespace dtl::grade
