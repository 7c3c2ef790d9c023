// sandbox_probe: what a process inside dtl-sandbox can still do. Prints one line per attempt,
// "NAME allowed" or "NAME denied (reason)"; sandbox_check.sh runs it under the grader's policy
// and asserts each line. Arguments: JOB_DIR FORBIDDEN_FILE [DEVICE_FILE] (a stand-in for a GPU's
// device node, granted with --rw).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace {
void report(const char* what, bool ok, int err = 0) {
  std::printf("%s %s\n", what,
              ok ? "allowed" : ("denied (" + std::string(std::strerror(err)) + ")").c_str());
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string job = argv[1], forbidden = argv[2];
  // A thread: must work (the labs run comm workers and watchdogs).
  bool ran = false;
  std::thread([&] { ran = true; }).join();
  report("thread", ran);
  // Writes: inside the job directory yes, beside it no.
  int fd = open((job + "/inside.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  report("write-job-dir", fd >= 0, errno);
  if (fd >= 0) close(fd);
  fd = open((job + "/../outside-" + std::to_string(getpid()) + ".txt").c_str(), O_WRONLY | O_CREAT,
            0644);
  report("write-outside", fd >= 0, errno);
  if (fd >= 0) close(fd);
  // Reads: a file outside what the run needs (the solutions, the hidden tests).
  fd = open(forbidden.c_str(), O_RDONLY);
  report("read-forbidden", fd >= 0, errno);
  if (fd >= 0) close(fd);
  fd = open("/etc/hostname", O_RDONLY);
  report("read-system", fd >= 0, errno);
  if (fd >= 0) close(fd);
  // A device node granted --rw (CUDA opens /dev/nvidia* read-write): opened so, but nothing may be
  // created beside it.
  if (argc > 3) {
    const std::string device = argv[3];
    fd = open(device.c_str(), O_RDWR);
    report("rw-device", fd >= 0, errno);
    if (fd >= 0) close(fd);
    fd = open((device + ".new").c_str(), O_WRONLY | O_CREAT, 0644);
    report("create-beside-device", fd >= 0, errno);
    if (fd >= 0) close(fd);
  }
  // A new program.
  char* const args[] = {const_cast<char*>("/bin/true"), nullptr};
  errno = 0;
  execv("/bin/true", args);  // returns only on failure
  report("exec", false, errno);
  // A new process.
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  report("fork", pid > 0, errno);
  if (pid > 0) waitpid(pid, nullptr, 0);
  // Another process's memory, and tracing.
  long rc = ptrace(PTRACE_ATTACH, getppid(), nullptr, nullptr);
  report("ptrace", rc == 0, errno);
  char buf[8] = {0};
  iovec local{buf, sizeof buf}, remote{buf, sizeof buf};
  rc = process_vm_writev(getppid(), &local, 1, &remote, 1, 0);
  report("process_vm_writev", rc >= 0, errno);
  rc = syscall(SYS_io_uring_setup, 8, buf);
  report("io_uring", rc >= 0, errno);
  // A signal to a process outside the sandbox (our parent: it ignores signal 0's effect).
  rc = kill(getppid(), 0);
  report("signal-outside", rc == 0, errno);
  return 0;
}
