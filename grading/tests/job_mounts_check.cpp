// job_mounts_check: a job run the way the grader runs student code (run_command with a PID
// namespace) sees only its own processes in /proc and has a /dev/shm of its own that vanishes
// with it. Needs root (as Gradescope grades); prints why and exits 77 (skipped) otherwise.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "run.hpp"

int main() {
  using namespace dtl::grade;
  if (!private_mounts_available()) {
    std::printf("job_mounts_check: skipped: no PID and mount namespaces here (needs root)\n");
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
  if (failures == 0) std::printf("job_mounts_check: OK\n");
  return failures == 0 ? 0 : 1;
}
