// Child processes with a hard timeout: nothing the student's code does can hang the grader.
#include "run.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dtl::grade {

std::string tail(const std::string& text, int lines) {
  if (lines <= 0) return "";
  size_t pos = text.size();
  int seen = 0;
  while (pos > 0) {
    size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text;
    if (nl != text.size() - 1 && ++seen == lines) return text.substr(nl + 1);
    pos = nl;
  }
  return text;
}

RunResult run_command(const std::vector<std::string>& argv, int timeout_seconds,
                      const std::vector<std::string>& env, const std::string& cwd,
                      const Limits& limits) {
  RunResult result;
  char path[] = "/tmp/dtl-grade-out-XXXXXX";
  int out_fd = mkstemp(path);
  if (out_fd < 0) {
    result.output = std::string("cannot create a temporary file: ") + std::strerror(errno);
    return result;
  }
  unlink(path);  // only the descriptor keeps it alive
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a timeout kills mpirun and every rank at once
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    // Inherited by mpirun and every rank: output beyond the cap ends the writer (SIGXFSZ)
    // instead of filling the disk; a rank past its memory cap fails to allocate.
    if (limits.file_bytes > 0) {
      rlimit r{static_cast<rlim_t>(limits.file_bytes), static_cast<rlim_t>(limits.file_bytes)};
      setrlimit(RLIMIT_FSIZE, &r);
    }
    if (limits.data_bytes > 0) {
      rlimit r{static_cast<rlim_t>(limits.data_bytes), static_cast<rlim_t>(limits.data_bytes)};
      setrlimit(RLIMIT_DATA, &r);
    }
    for (auto& kv : env) putenv(strdup(kv.c_str()));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  int status = 0;
  const auto deadline = start + std::chrono::seconds(timeout_seconds);
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    struct stat st {};
    const bool flooded = limits.file_bytes > 0 && fstat(out_fd, &st) == 0 &&
                         st.st_size >= limits.file_bytes;
    if (flooded || std::chrono::steady_clock::now() > deadline) {
      (flooded ? result.output_limited : result.timed_out) = true;
      kill(-pid, SIGTERM);
      auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (waitpid(pid, &status, WNOHANG) != pid) {
        if (std::chrono::steady_clock::now() > grace) {
          kill(-pid, SIGKILL);
          waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);  // stragglers of the group (orphaned ranks)
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  // Read back what the child wrote (bounded: keep the last 256 KiB).
  off_t size = lseek(out_fd, 0, SEEK_END);
  off_t from = size > (256 << 10) ? size - (256 << 10) : 0;
  result.output.resize(static_cast<size_t>(size - from));
  if (pread(out_fd, result.output.data(), result.output.size(), from) < 0) result.output.clear();
  close(out_fd);
  return result;
}

bool kill_user_processes(int uid, int gid) {
  if (geteuid() != 0 || uid <= 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(static_cast<gid_t>(gid)) != 0 || setuid(static_cast<uid_t>(uid)) != 0) _exit(1);
    kill(-1, SIGKILL);  // every process this uid may signal, except the caller itself
    _exit(0);
  }
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void adopt_orphans() { prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

int kill_descendants() {
  const pid_t self = getpid();
  int killed = 0;
  // Killing a process re-parents its own children to us (we are their subreaper): sweep until
  // no child is left, a bounded number of times.
  for (int round = 0; round < 50; ++round) {
    std::vector<pid_t> children;
    if (DIR* proc = opendir("/proc")) {
      while (dirent* e = readdir(proc)) {
        const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
        if (pid <= 0) continue;
        std::ifstream stat(std::string("/proc/") + e->d_name + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
        const size_t close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 1));
        char state = 0;
        int ppid = 0;
        rest >> state >> ppid;
        if (ppid == self) children.push_back(pid);
      }
      closedir(proc);
    }
    if (children.empty()) break;
    for (pid_t pid : children) {
      if (kill(pid, SIGKILL) == 0) ++killed;
      waitpid(pid, nullptr, 0);
    }
  }
  return killed;
}

std::string capture(const std::string& shell_command) {
  FILE* pipe = popen(shell_command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + shell_command);
  std::string out;
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0) throw std::runtime_error("failed: " + shell_command);
  return out;
}

}  // namespace dtl::grade
