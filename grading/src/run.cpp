// Child processes with a hard timeout (run.hpp).
#include "run.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

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

namespace {

long long dir_size(const std::string& dir) {
  long long total = 0;
  std::error_code ec;
  for (auto it =
           fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    struct stat st {};
    if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += st.st_blocks * 512LL;
  }
  return total;
}

// In the child, after fork: limits, identity, then the program. Never returns.
[[noreturn]] void exec_child(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const Limits& limits,
                             const Identity& as) {
  // Inherited by mpirun and every rank: a file beyond the cap ends the writer (SIGXFSZ) instead
  // of filling the disk; a rank past its memory cap fails to allocate.
  if (limits.file_bytes > 0) {
    rlimit r{static_cast<rlim_t>(limits.file_bytes), static_cast<rlim_t>(limits.file_bytes)};
    setrlimit(RLIMIT_FSIZE, &r);
  }
  if (limits.data_bytes > 0) {
    rlimit r{static_cast<rlim_t>(limits.data_bytes), static_cast<rlim_t>(limits.data_bytes)};
    setrlimit(RLIMIT_DATA, &r);
  }
  if (as.dropped() && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(as.gid)) != 0 ||
                       setuid(static_cast<uid_t>(as.uid)) != 0)) {
    std::fprintf(stderr, "cannot switch to uid %d: %s\n", as.uid, std::strerror(errno));
    _exit(126);
  }
  for (auto& kv : env) putenv(strdup(kv.c_str()));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

// A new PID namespace for this process's next child. Root unshares it directly. An ordinary
// user (an instructor's cluster account) first enters a user namespace of its own, where it has
// the capabilities a PID and a mount namespace need, mapped to itself only (uid and gid inside =
// outside): the job keeps the caller's identity and files, and its programs, not uid 0 in there,
// lose those capabilities when they are executed. Kernels or policies that forbid unprivileged
// user namespaces (a sysctl, AppArmor's restriction on Ubuntu 24.04) fail here: no namespace.
bool unshare_pid_namespace() {
  if (geteuid() == 0) return unshare(CLONE_NEWPID) == 0;
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) return false;
  auto write_file = [](const char* path, const std::string& text) {
    const int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    return ok;
  };
  // setgroups must be denied before an unprivileged process may write its gid map.
  return write_file("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1\n") &&
         write_file("/proc/self/setgroups", "deny") &&
         write_file("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1\n");
}

// In the job's first process, PID 1 of its namespace: a mount namespace whose /proc is the PID
// namespace's (the job sees its own processes only) and whose /dev/shm is an empty tmpfs of
// `shm_bytes` that vanishes with the job. Mounts made private first, so nothing propagates back.
bool make_private_mounts(long long shm_bytes) {
  if (unshare(CLONE_NEWNS) != 0) return false;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  const std::string shm = "mode=1777,size=" + std::to_string(shm_bytes > 0 ? shm_bytes : 1LL << 30);
  return mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0 &&
         mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, shm.c_str()) == 0;
}

}  // namespace

bool private_mounts_available() {
  static const bool available = [] {
    if (!pid_namespaces_available()) return false;
    const pid_t pid = fork();
    if (pid == 0) {
      // As a job gets them: the PID namespace here, the mounts in its first process.
      if (!unshare_pid_namespace()) _exit(1);
      const pid_t init = fork();
      if (init == 0) _exit(make_private_mounts(1 << 20) ? 0 : 1);
      int status = 0;
      _exit(init > 0 && waitpid(init, &status, 0) == init && WIFEXITED(status) ? WEXITSTATUS(status) : 1);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  }();
  return available;
}

bool pid_namespaces_available() {
  static const bool available = [] {
    const pid_t pid = fork();
    if (pid == 0) _exit(unshare_pid_namespace() ? 0 : 1);
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  }();
  return available;
}

RunResult run_command(const std::vector<std::string>& argv, int timeout_seconds,
                      const std::vector<std::string>& env, const std::string& cwd,
                      const Limits& limits, const Launch& launch) {
  RunResult result;
  char path[] = "/tmp/dtl-grade-out-XXXXXX";
  int out_fd = mkstemp(path);
  if (out_fd < 0) {
    result.output = std::string("cannot create a temporary file: ") + std::strerror(errno);
    return result;
  }
  unlink(path);  // only the descriptor keeps it alive
  const bool namespace_ = launch.own_pid_namespace && pid_namespaces_available();
  const bool mounts = namespace_ && private_mounts_available();  // probed here, not in the child
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // own process group: a timeout kills mpirun and every rank at once
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    if (!namespace_) exec_child(argv, env, limits, launch.as);
    // The job's first process becomes PID 1 of a new namespace: when it ends, the kernel kills
    // everything else in there. This process waits for it and passes its status on.
    if (!unshare_pid_namespace()) exec_child(argv, env, limits, launch.as);
    const pid_t init = fork();
    if (init == 0) {
      // Where the probe said yes, a failure here stops the job: the sandbox lets it write in
      // /dev/shm only because that /dev/shm is its own.
      if (mounts && !make_private_mounts(launch.shm_bytes)) {
        std::fprintf(stderr, "dtl-grade: cannot give the job its own /proc and /dev/shm: %s\n",
                     std::strerror(errno));
        _exit(126);
      }
      exec_child(argv, env, limits, launch.as);
    }
    int status = 0;
    while (waitpid(init, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) {
      signal(WTERMSIG(status), SIG_DFL);
      raise(WTERMSIG(status));
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
  }
  setpgid(pid, pid);
  int status = 0;
  const auto deadline = start + std::chrono::seconds(timeout_seconds);
  auto next_dir_check = start;
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    struct stat st {};
    const bool flooded =
        limits.output_bytes > 0 && fstat(out_fd, &st) == 0 && st.st_size >= limits.output_bytes;
    bool disk = false;
    const auto now = std::chrono::steady_clock::now();
    if (limits.dir_bytes > 0 && !limits.watch_dir.empty() && now >= next_dir_check) {
      disk = dir_size(limits.watch_dir) > limits.dir_bytes;
      next_dir_check = now + std::chrono::seconds(1);
    }
    if (flooded || disk || now > deadline) {
      (flooded ? result.output_limited : disk ? result.disk_limited : result.timed_out) = true;
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

void adopt_orphans() { prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

namespace {
// The live (not zombie) children of this process; zombies are reaped on the way.
std::vector<pid_t> live_children() {
  const pid_t self = getpid();
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
      if (ppid != self) continue;
      if (state == 'Z')
        waitpid(pid, nullptr, WNOHANG);
      else
        children.push_back(pid);
    }
    closedir(proc);
  }
  return children;
}
}  // namespace

int kill_descendants() {
  // Ranks that were still on their way out when mpirun returned are re-parented here for a
  // moment: give them half a second to finish before anything counts as left behind.
  for (int i = 0; i < 25 && !live_children().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int killed = 0;
  // Killing a process re-parents its own children to us (we are their subreaper): sweep until
  // no child is left, a bounded number of times.
  for (int round = 0; round < 50; ++round) {
    std::vector<pid_t> children = live_children();
    if (children.empty()) break;
    for (pid_t pid : children) {
      if (kill(pid, SIGKILL) == 0) ++killed;
      waitpid(pid, nullptr, 0);
    }
  }
  return killed;
}

}  // namespace dtl::grade
