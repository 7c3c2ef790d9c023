// The sandboxed run and its verdict (jobs.hpp).
#include "jobs.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "dtl/harness/untrusted_file.hpp"
#include "results.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtl::grade {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, '|');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// A program's real path (PATH looked up, links resolved); "" if absent.
std::string which(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path p = fs::path(dir) / program;
    if (access(p.c_str(), X_OK) == 0) {
      char buf[PATH_MAX];
      return realpath(p.c_str(), buf) ? std::string(buf) : p.string();
    }
  }
  return "";
}

uint64_t fresh_seed() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = static_cast<uint64_t>(time(nullptr));
  return seed % 1000000007ull;  // a number DTL_SEED's strtoull reads back exactly
}

}  // namespace

std::string failure_text(const json& failures, size_t max) {
  static const std::regex rank_prefix(R"(^Failed\n\[rank (\d+)/\d+\] )");
  // The digits of a report's "[rank r/n]" (a rank has at most 6 digits; -1 for anything else).
  auto rank_number = [](const std::string& digits) {
    return digits.size() <= 6 ? std::stoi(digits) : -1;
  };
  std::vector<std::string> order;
  std::map<std::string, std::string> first;               // location -> message
  // location -> how many more times each rank failed it (a check in a loop fails once per
  // iteration: "rank 0 (x117), rank 2", not 117 zeros)
  std::map<std::string, std::map<int, int>> ranks;
  std::map<std::string, int> first_rank;  // location -> the rank of the message shown
  for (auto& f : failures) {
    std::string text = plain(f.value("failure", "failed"));
    const size_t nl = text.find('\n');
    const std::string where = nl == std::string::npos ? "" : text.substr(0, nl);
    std::string body = nl == std::string::npos ? text : text.substr(nl + 1);
    std::smatch m;
    std::string rank = "0";
    if (std::regex_search(body, m, rank_prefix)) {
      rank = m[1].str();
      body = m.suffix().str();
    }
    const std::string key = where.empty() ? body : where;
    if (!first.count(key)) {
      order.push_back(key);
      first[key] = (where.empty() ? "" : where + "\n") + body;
      first_rank[key] = rank_number(rank);
    } else {
      ++ranks[key][rank_number(rank)];
    }
  }
  std::string out;
  for (const auto& key : order) {
    std::string msg = first[key];
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    out += msg;
    std::string list;
    int times = 0;
    for (auto& [r, count] : ranks[key]) {
      list += fmt::format("{}rank {}{}", list.empty() ? "" : ", ", r,
                          count > 1 ? fmt::format(" (x{})", count) : "");
      times += count;
    }
    const std::string more =
        times ? fmt::format("the same check failed {} more time{}: {}", times, times > 1 ? "s" : "",
                            list)
              : "";
    if (first_rank[key] != 0)
      out += fmt::format("\n(on rank {}{}{})", first_rank[key], more.empty() ? "" : "; ", more);
    else if (!more.empty())
      out += fmt::format("\n({})", more);
    out += "\n";
    if (out.size() > max) {
      out = out.substr(0, max) + "\n... (more in the log)\n";
      break;
    }
  }
  return out;
}

JobRunner::JobRunner(const Options& opt, const Identity& student, std::string reports,
                     std::vector<std::string> libraries)
    : opt_(opt),
      student_(student),
      reports_(std::move(reports)),
      libraries_(std::move(libraries)) {}

std::vector<std::string> JobRunner::mpirun(int n, bool sandboxed) const {
  // Inside the launcher's sandbox mpirun is executed by path (execve does not search PATH).
  std::string program = "mpirun";
  if (sandboxed && opt_.sandbox)
    if (const std::string p = which("mpirun"); !p.empty()) program = p;
  std::vector<std::string> cmd = {program, "-n", std::to_string(n)};
  for (auto& f : split_list(DTL_MPIRUN_FLAGS)) cmd.push_back(f);
  return cmd;
}

// cmake/mpirun.env, compiled in (the one place CMake, ./lab and the grader read it from),
// plus: no emulator, trace or Gantt chart may leak into a graded run from the environment.
std::vector<std::string> JobRunner::mpi_env() const {
  std::vector<std::string> env = split_list(DTL_MPIRUN_ENV);
  for (const char* clear : {"DTL_NET=", "DTL_TRACE=", "DTL_GANTT="}) env.push_back(clear);
  // OpenMPI's single-copy transfers between ranks (CMA) read other processes' memory, which the
  // sandbox forbids and an unprivileged user is denied ("Read -1, expected ..."): copy through
  // the shared-memory segment instead.
  env.push_back("OMPI_MCA_btl_vader_single_copy_mechanism=none");
  return env;
}

std::string JobRunner::job_dir() {
  const fs::path dir = fs::path(reports_) / fmt::format("job-{}", counter_++);
  fs::create_directories(dir);
  if (student_.dropped()) {
    (void)!chown(dir.c_str(), static_cast<uid_t>(student_.uid), static_cast<gid_t>(student_.gid));
    // The reports directory itself stays the grader's; the student's user only passes through.
    fs::permissions(reports_, fs::perms::owner_all | fs::perms::others_exec);
  }
  return dir.string();
}

Limits JobRunner::student_limits(const std::string& job_dir) const {
  Limits l;
  l.output_bytes = static_cast<long long>(opt_.output_limit_mb) << 20;
  l.file_bytes = std::max<long long>(l.output_bytes, 1LL << 30);  // observations can be large
  l.data_bytes = static_cast<long long>(opt_.memory_limit_mb) << 20;
  l.watch_dir = job_dir;
  l.dir_bytes = static_cast<long long>(opt_.disk_limit_mb) << 20;
  return l;
}

Launch JobRunner::student_launch() const {
  Launch l;
  l.as = student_;
  l.own_pid_namespace = true;
  l.shm_bytes = std::min<long long>(1LL << 30, static_cast<long long>(opt_.disk_limit_mb) << 20);
  return l;
}

// The device nodes CUDA opens read-write (/dev/nvidiactl, /dev/nvidia0..N, /dev/nvidia-uvm and
// -uvm-tools, -modeset, -nvswitchctl, and MIG's /dev/nvidia-caps/*), when the job runs on CUDA
// (DTL_DEVICE=cuda, as `DTL_DEVICE=cuda ./lab grade` sets it). None on a machine without GPUs.
static std::vector<std::string> gpu_device_nodes() {
  const char* device = std::getenv("DTL_DEVICE");
  if (!device || std::string(device) != "cuda") return {};
  std::vector<std::string> nodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec))
    if (e.path().filename().string().rfind("nvidia", 0) == 0) nodes.push_back(e.path().string());
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

// mpirun's own programs, where this machine has them (OpenMPI 4: orterun, orted; OpenMPI 5:
// prterun, prted, prte).
static std::vector<std::string> mpi_programs() {
  std::vector<std::string> found;
  for (const char* program : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte"})
    if (const std::string p = which(program); !p.empty()) found.push_back(p);
  return found;
}

// What every sandboxed process of a job may touch (sandbox.hpp): write the job's directory (and
// its own /dev/shm), read the system and the tests' libraries, use the GPUs.
std::vector<std::string> JobRunner::policy_args(const std::string& job_dir) const {
  std::vector<std::string> cmd = {"--write", job_dir};
  // What a rank reads: system libraries and configuration, /proc and /sys (MPI's and the BLAS's
  // view of the machine), devices (/dev/null, /dev/urandom, GPUs), and the directories of the
  // shared libraries the tests load (the runtime's, a LibTorch outside /usr). Not the course's
  // sources, solutions, hidden tests or other binaries.
  std::set<std::string> read = {"/usr", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev"};
  for (const auto& lib : libraries_) read.insert(fs::path(lib).parent_path().string());
  for (const auto& r : read) {
    cmd.push_back("--read");
    cmd.push_back(r);
  }
  for (const auto& node : gpu_device_nodes()) {
    cmd.push_back("--rw");
    cmd.push_back(node);
  }
  // NCCL's shared memory within a node (/dev/shm/nccl-*): writable only where the job has a
  // /dev/shm of its own (run.hpp), never the machine's, which other gradings use too.
  if (private_mounts_available()) {
    cmd.push_back("--write");
    cmd.push_back("/dev/shm");
  }
  return cmd;
}

std::vector<std::string> JobRunner::sandbox_prefix(const std::string& job_dir,
                                                   bool processes) const {
  if (!opt_.sandbox) return {};
  std::vector<std::string> cmd = {(fs::path(opt_.build) / "bin" / "dtl-sandbox").string()};
  for (auto& a : policy_args(job_dir)) cmd.push_back(a);
  if (processes) {
    cmd.push_back("--processes");
    for (const auto& p : mpi_programs()) {
      cmd.push_back("--exec");
      cmd.push_back(p);
    }
  }
  cmd.push_back("--");
  return cmd;
}

std::vector<std::string> JobRunner::launcher_prefix(const std::string& job_dir,
                                                    const std::string& program) const {
  if (!opt_.sandbox) return {};
  const std::string sandbox = (fs::path(opt_.build) / "bin" / "dtl-sandbox").string();
  std::vector<std::string> cmd = {sandbox};
  for (auto& a : policy_args(job_dir)) cmd.push_back(a);
  // mpirun starts processes, so it may fork and exec, but only these programs: its own, the
  // per-rank launcher and the test binary. A rank that asks mpirun to start anything else
  // (MPI_Comm_spawn) is refused by the kernel, and whatever mpirun starts inherits this domain.
  cmd.push_back("--processes");
  std::vector<std::string> exec = mpi_programs();
  exec.push_back(sandbox);
  exec.push_back(program);
  for (const auto& p : exec) {
    cmd.push_back("--exec");
    cmd.push_back(p);
  }
  cmd.push_back("--");
  return cmd;
}

void JobRunner::read_report(const std::string& path, Job& job) const {
  // Written by the job: never through a link, only a regular file, at most 64 MiB.
  std::string text, why;
  job.report = read_untrusted_file(path, size_t{64} << 20, text, why)
                   ? json::parse(text, nullptr, false)
                   : json(json::value_t::discarded);
  std::error_code ec;
  fs::remove(path, ec);
  if (job.report.is_discarded() || !job.report.contains("testsuites")) return;
  for (auto& suite : job.report["testsuites"])
    for (auto& t : suite.value("testsuite", json::array())) {
      const std::string name = suite.value("name", "") + "." + t.value("name", "");
      if (t.contains("failures") && !t["failures"].empty())
        job.failed[name] = failure_text(t["failures"]);
      else if (t.value("result", "") == "COMPLETED")
        job.passed.insert(name);
      else if (t.value("result", "") == "SKIPPED")
        job.skipped.insert(name);
    }
}

Job JobRunner::run(const JobPlan& plan) {
  Job job;
  job.timeout = plan.timeout;
  const std::string dir = plan.untrusted ? job_dir() : reports_;
  const std::string tag =
      fmt::format("{}_n{}_{}", fs::path(plan.worker).filename().string(), plan.world, counter_++);
  const std::string seed = std::to_string(fresh_seed());
  // ---- worker: mpirun inside a domain of its own (launcher_prefix), each rank inside its own
  std::vector<std::string> cmd;
  if (plan.untrusted) cmd = launcher_prefix(dir, plan.worker);
  for (auto& a : mpirun(plan.world, plan.untrusted)) cmd.push_back(a);
  if (plan.untrusted)
    for (auto& a : sandbox_prefix(dir, plan.processes)) cmd.push_back(a);
  const std::string worker_report = fmt::format("{}/{}.worker.json", dir, tag);
  for (std::string a :
       {plan.worker, "--gtest_filter=" + plan.filter, "--gtest_output=json:" + worker_report,
        std::string("--gtest_color=no"), fmt::format("--dtl_timeout={}", plan.test_timeout)})
    cmd.push_back(a);
  const bool split = !plan.driver.empty();
  if (split) cmd.push_back("--dtl_record=" + dir);
  auto env = mpi_env();
  const std::string watchdog_report = fmt::format("{}/{}.watchdog.json", dir, tag);
  env.push_back("DTL_WATCHDOG_REPORT=" + watchdog_report);
  env.push_back("DTL_SEED=" + seed);
  if (plan.untrusted) {
    // Everything the job writes stays in its directory: OpenMPI's session files and shared
    // memory, the tests' scratch directories, anything under $HOME.
    for (const char* var : {"TMPDIR=", "HOME=", "OMPI_MCA_btl_vader_backing_directory="})
      env.push_back(var + dir);
  }
  job.worker = plan.untrusted
                   ? run_command(cmd, plan.timeout, env, dir, student_limits(dir), student_launch())
                   : run_command(cmd, plan.timeout, env, reports_);
  if (keep_job_dirs()) std::ofstream(reports_ + "/" + tag + ".worker.log") << job.worker.output;
  {
    std::string text, why;
    job.watchdog = read_untrusted_file(watchdog_report, size_t{16} << 20, text, why)
                       ? json::parse(text, nullptr, false)
                       : json(json::value_t::discarded);
  }
  read_report(worker_report, job);
  // ---- driver: only when the worker's report leaves something to confirm
  const bool worker_ended = !job.worker.timed_out && !job.worker.output_limited &&
                            !job.worker.disk_limited && job.worker.signal == 0;
  const bool nothing_passed = worker_ended && !job.report.is_discarded() && job.passed.empty() &&
                              (job.worker.exit_code == 0 || job.worker.exit_code == 1);
  std::error_code ec;
  // Without a driver, or when the worker's report shows nothing passing (a forged report could
  // only cost its author here), the worker's report is the verdict.
  if (!split || nothing_passed) {
    if (plan.untrusted && !keep_job_dirs()) fs::remove_all(dir, ec);
    return job;
  }
  job.split = true;
  job.driver_ran = true;
  const std::string trusted = fmt::format("{}/{}", reports_, tag);
  fs::create_directories(trusted);
  fs::permissions(trusted, fs::perms::owner_all);
  const std::string driver_report = trusted + "/driver.json", summary = trusted + "/summary.json";
  std::vector<std::string> dcmd = mpirun(plan.world);
  for (std::string a :
       {plan.driver, "--gtest_filter=" + plan.filter, "--gtest_output=json:" + driver_report,
        std::string("--gtest_color=no"), fmt::format("--dtl_timeout={}", plan.test_timeout),
        "--dtl_check=" + dir, "--dtl_check_summary=" + summary})
    dcmd.push_back(a);
  auto denv = mpi_env();
  denv.push_back("DTL_SEED=" + seed);
  denv.push_back("DTL_WATCHDOG_REPORT=" + trusted + "/watchdog.json");
  denv.push_back("TMPDIR=" + trusted);
  job.failed.clear();
  job.passed.clear();
  job.skipped.clear();
  // The driver reads what the worker left: bounded files (untrusted_file.hpp), and its own heap
  // capped as a student run's is, so no input can make it take the grading machine's memory.
  Limits driver_limits;
  driver_limits.data_bytes = static_cast<long long>(opt_.memory_limit_mb) << 20;
  job.driver = run_command(dcmd, plan.timeout, denv, trusted, driver_limits);
  read_report(driver_report, job);
  {
    std::ifstream in(summary);
    job.summary = json::parse(in, nullptr, false);
  }
  if (keep_job_dirs()) {
    std::ofstream(trusted + "/driver.log") << job.driver.output;
    return job;
  }
  fs::remove_all(trusted, ec);
  if (plan.untrusted) fs::remove_all(dir, ec);
  return job;
}

}  // namespace dtl::grade
