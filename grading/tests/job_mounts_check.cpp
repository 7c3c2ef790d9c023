// job_mounts_check: a job run the way the grader runs student code (run_command with a PID
// namespace) sees only its own processes in /proc and has a /dev/shm of its own that vanishes
// with it: as root (as Gradescope grades), and as an ordinary user (an instructor's cluster
// account: through a user namespace). Run as root, it checks both: itself, then itself again as
// the user nobody. Exits 77 (skipped), saying why, where the kernel gives no namespaces.
#include <grp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "run.hpp"

namespace {

// Whether this kernel lets an ordinary user make a user namespace at all (a sysctl may forbid it):
// if it does, the grader must get its PID and mount namespaces through one.
bool unprivileged_user_namespaces() {
  const pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWUSER) == 0 ? 0 : 1);
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// This program again, as the user nobody: 0 passed, 77 skipped, else failed.
int check_as_nobody(const char* self) {
  std::fflush(stdout);  // the root check's lines first
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
    execl(self, self, "--unprivileged", static_cast<char*>(nullptr));
    std::printf("job_mounts_check: cannot run %s as nobody (%s): the unprivileged check skipped\n",
                self, std::strerror(errno));
    _exit(77);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 1;
  return WEXITSTATUS(status);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtl::grade;
  const bool root = geteuid() == 0;
  const char* who = root ? "root" : "an ordinary user";
  if (!private_mounts_available()) {
    // An ordinary user on a kernel that allows user namespaces must get them: a regression of
    // the unprivileged path fails here instead of quietly falling back to the subreaper.
    if (!root && unprivileged_user_namespaces()) {
      std::printf("job_mounts_check: FAIL: user namespaces are allowed here, but the grader "
                  "gives jobs no PID and mount namespaces as %s\n", who);
      return 1;
    }
    std::printf("job_mounts_check: skipped: no PID and mount namespaces here for %s\n", who);
    return 77;
  }
  const std::string marker = "/dev/shm/dtl-job-mounts-check-" + std::to_string(getpid());
  Launch launch;
  launch.own_pid_namespace = true;
  launch.shm_bytes = 1 << 20;
  // Counts the processes /proc lists, then leaves a file in /dev/shm.
  const RunResult r = run_command(
      {"sh", "-c", "n=0; for d in /proc/[0-9]*; do n=$((n+1)); done; echo procs=$n; echo x > " +
                       marker + " && echo shm=written; ls /dev/shm | wc -l"},
      30, {}, "", {}, launch);
  std::printf("%s", r.output.c_str());
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("job_mounts_check: FAIL: %s\n", what);
      ++failures;
    }
  };
  check(r.exit_code == 0, "the job did not run");
  // sh and the shell's own children (ls, wc): a handful, never the machine's processes.
  int procs = -1;
  std::sscanf(r.output.c_str(), "procs=%d", &procs);
  check(procs > 0 && procs <= 5, "/proc in the job lists processes that are not the job's");
  check(r.output.find("shm=written") != std::string::npos, "the job cannot write its /dev/shm");
  check(!std::filesystem::exists(marker), "the job's /dev/shm is the machine's");
  if (failures == 0) std::printf("job_mounts_check: OK as %s\n", who);
  if (root && argc == 1) {
    const int as_nobody = check_as_nobody(argv[0]);
    if (as_nobody != 0 && as_nobody != 77) ++failures;
  }
  return failures == 0 ? 0 : 1;
}
