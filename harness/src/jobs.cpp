// Child jobs for fault tests: see dtl/harness/jobs.hpp.
#include "dtl/harness/jobs.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <sstream>

#include "dtl/error.hpp"
#include "dtl/timer.hpp"

extern char** environ;

namespace dtl::testing {

namespace {

// cmake/mpirun.env, compiled in (harness/CMakeLists.txt): mpirun's flags and the environment
// of every MPI job, each list joined with '|'.
std::vector<std::string> split_bars(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, '|');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// A process of a running MPI job carries variables that tie it to that job (its rank, the
// launcher's address): a nested mpirun that saw them would try to join the job it runs in.
// Keep everything else, and the job environment of mpirun.env.
std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  const std::vector<std::string> job_env = split_bars(DTL_MPIRUN_ENV);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool tied = false;
    for (const char* prefix : {"OMPI_", "PMIX_", "OPAL_", "ORTE_", "PRTE_", "HYDRA_", "PMI_"})
      tied = tied || key.rfind(prefix, 0) == 0;
    // The test's own report paths belong to the test, not to its children.
    tied = tied || key == "GTEST_OUTPUT" || key == "DTL_WATCHDOG_REPORT";
    if (!tied) env.push_back(kv);
  }
  for (const auto& kv : job_env) env.push_back(kv);
  for (const auto& kv : extra) env.push_back(kv);
  return env;
}

std::map<std::string, JobMain>& registry() {
  static std::map<std::string, JobMain> jobs;
  return jobs;
}

}  // namespace

std::string JobResult::describe() const {
  std::string how = timed_out   ? fmt::format("timed out after {:.1f} s", seconds)
                    : signal    ? fmt::format("ended by signal {} after {:.1f} s", signal, seconds)
                                : fmt::format("exit {} after {:.1f} s", exit_code, seconds);
  // The last 40 lines are what a reader needs (the error, the watchdog's summary).
  size_t pos = output.size();
  for (int lines = 0; pos > 0 && lines < 40; ++lines) {
    pos = output.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
  }
  return how + "; output:\n" + output.substr(pos);
}

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  DTL_CHECK(n > 0, "self_exe: readlink(/proc/self/exe) failed");
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::string job_arg(const std::vector<std::string>& args, const std::string& key,
                    const std::string& fallback) {
  for (const auto& a : args)
    if (a.rfind(key + "=", 0) == 0) return a.substr(key.size() + 1);
  return fallback;
}

bool register_job(const char* name, JobMain fn) {
  registry()[name] = fn;
  return true;
}

JobMain find_job(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

JobResult run_mpi_job(int ranks, const std::string& exe, const std::vector<std::string>& args,
                      double timeout_s, const std::vector<std::string>& env) {
  std::vector<std::string> argv = {DTL_MPIEXEC, "-n", std::to_string(ranks)};
  for (const auto& f : split_bars(DTL_MPIRUN_FLAGS)) argv.push_back(f);
  argv.push_back(exe);
  for (const auto& a : args) argv.push_back(a);
  std::vector<std::string> envs = child_environment(env);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int fds[2];
  DTL_CHECK(pipe(fds) == 0, "run_mpi_job: pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, STDIN_FILENO);  // mpirun forwards stdin otherwise
  pid_t pid = 0;
  const double start = now_seconds();
  const int rc = posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw Error(fmt::format("run_mpi_job: cannot start {}: {}", argv[0], std::strerror(rc)));
  }

  JobResult result;
  double deadline = start + timeout_s, kill_at = 0;
  bool open = true;
  char buf[4096];
  while (open) {
    const double now = now_seconds();
    if (!result.timed_out && now > deadline) {
      result.timed_out = true;
      kill(pid, SIGTERM);  // mpirun ends its ranks
      kill_at = now + 3;
    }
    if (kill_at > 0 && now > kill_at) {
      kill(pid, SIGKILL);
      kill_at = 0;
      break;  // a rank may still hold the pipe open: stop reading
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0)
        result.output.append(buf, static_cast<size_t>(n));
      else if (n == 0 || errno != EINTR)
        open = false;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.seconds = now_seconds() - start;
  if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    if (result.exit_code > 128 && result.exit_code < 160) result.signal = result.exit_code - 128;
  }
  return result;
}

JobResult run_job(const std::string& name, int ranks, const std::vector<std::string>& args,
                  double timeout_s, const std::vector<std::string>& env) {
  DTL_CHECK(find_job(name) != nullptr, fmt::format("run_job: no DTL_JOB({}) in this binary", name));
  std::vector<std::string> all = {"--dtl_job=" + name,
                                  fmt::format("--dtl_timeout={}", std::max(1.0, timeout_s - 5))};
  all.insert(all.end(), args.begin(), args.end());
  return run_mpi_job(ranks, self_exe(), all, timeout_s, env);
}

}  // namespace dtl::testing
