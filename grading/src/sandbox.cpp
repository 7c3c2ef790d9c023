// The sandbox of student processes (sandbox.hpp): Landlock for the file system, seccomp for
// system calls, installed in this order and then handed over to the test binary by execve.
#include "sandbox.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

// Newer Landlock features than Debian 12's kernel headers name (the running kernel decides).
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_SCOPE_SIGNAL
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif

extern char** environ;

namespace dtl::grade {

namespace {

// landlock_ruleset_attr as of ABI 6 (the kernel reads as many fields as the size we pass).
struct RulesetAttr {
  uint64_t handled_access_fs = 0;
  uint64_t handled_access_net = 0;
  uint64_t scoped = 0;
};

int landlock_abi() {
  const long v = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return v < 0 ? 0 : static_cast<int>(v);
}

constexpr uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr uint64_t kFileRights = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                                 LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_TRUNCATE;

// The file-system rights this kernel's Landlock knows: all of them are handled (denied unless a
// rule grants them), except ioctl on devices (ABI 5), which the runs do not need restricted.
uint64_t handled_rights(int abi) {
  uint64_t all = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: bits 0..12
  if (abi >= 2) all |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) all |= LANDLOCK_ACCESS_FS_TRUNCATE;
  return all;
}

// Adds "these rights beneath path" (a file gets the file rights among them). A path that does
// not exist is skipped: a policy lists what a run may need, not what every machine has.
std::string allow(int ruleset, const std::string& path, uint64_t rights) {
  const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "" : "cannot open " + path + ": " + std::strerror(errno);
  struct stat st {};
  fstat(fd, &st);
  landlock_path_beneath_attr rule{};
  rule.allowed_access = S_ISDIR(st.st_mode) ? rights : rights & kFileRights;
  rule.parent_fd = fd;
  const long rc = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
  const int err = errno;
  close(fd);
  if (rc != 0) return "landlock_add_rule(" + path + "): " + std::strerror(err);
  return "";
}

std::string install_landlock(const SandboxPolicy& p, int abi) {
  const uint64_t handled = handled_rights(abi);
  RulesetAttr attr;
  attr.handled_access_fs = handled;
  size_t size = sizeof(uint64_t);  // ABI 1-3: only handled_access_fs
  if (abi >= 6) {
    attr.scoped = LANDLOCK_SCOPE_SIGNAL;  // no signal to processes outside the sandbox
    size = sizeof(RulesetAttr);
  }
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, size, 0));
  if (ruleset < 0) return std::string("landlock_create_ruleset: ") + std::strerror(errno);
  std::string err;
  for (const auto& path : p.read)
    if (err.empty()) err = allow(ruleset, path, kRead);
  for (const auto& path : p.exec)
    if (err.empty())
      err = allow(ruleset, path, LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE);
  for (const auto& path : p.rw)
    if (err.empty())
      err = allow(ruleset, path,
                  handled & (kRead | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_TRUNCATE));
  for (const auto& path : p.write)
    if (err.empty()) err = allow(ruleset, path, handled & ~LANDLOCK_ACCESS_FS_EXECUTE);
  if (err.empty() && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0)
    err = std::string("landlock_restrict_self: ") + std::strerror(errno);
  close(ruleset);
  return err;
}

// System calls no lab needs and an attack would: each fails with EPERM.
const char* const kDenied[] = {"ptrace",
                               "process_vm_readv",
                               "process_vm_writev",
                               "process_madvise",
                               "pidfd_getfd",
                               "kcmp",
                               "io_uring_setup",
                               "io_uring_enter",
                               "io_uring_register",
                               "bpf",
                               "perf_event_open",
                               "userfaultfd",
                               "unshare",
                               "setns",
                               "mount",
                               "umount2",
                               "pivot_root",
                               "chroot",
                               "move_mount",
                               "open_tree",
                               "fsopen",
                               "fsmount",
                               "fsconfig",
                               "fspick",
                               "mount_setattr",
                               "kexec_load",
                               "kexec_file_load",
                               "init_module",
                               "finit_module",
                               "delete_module",
                               "reboot",
                               "swapon",
                               "swapoff",
                               "keyctl",
                               "add_key",
                               "request_key",
                               "open_by_handle_at",
                               "name_to_handle_at",
                               "personality",
                               "acct",
                               "quotactl",
                               "settimeofday",
                               "clock_settime",
                               "adjtimex",
                               "syslog",
                               "execveat"};

std::string install_seccomp(const SandboxPolicy& p, char* path, char** args) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return "seccomp_init failed";
  const uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  int rc = 0;
  for (const char* name : kDenied) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr != __NR_SCMP_ERROR && rc == 0) rc = seccomp_rule_add(ctx, deny, nr, 0);
  }
  // clone3 passes its flags in memory, where a filter cannot look: fail it as "not
  // implemented", and the C library falls back to clone, whose flags it can check.
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (!p.processes) {
    // Threads (CLONE_THREAD) yes, processes no.
    if (rc == 0)
      rc =
          seccomp_rule_add(ctx, deny, SCMP_SYS(clone), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, static_cast<scmp_datum_t>(CLONE_THREAD), 0));
    if (rc == 0) rc = seccomp_rule_add(ctx, deny, SCMP_SYS(fork), 0);
    if (rc == 0) rc = seccomp_rule_add(ctx, deny, SCMP_SYS(vfork), 0);
    // execve exactly once: the hand-over below, recognised by the addresses of its path and
    // argument vector. The new program's address space has neither at a known place (the
    // launcher's are randomised), so it cannot repeat the call.
    if (rc == 0)
      rc = seccomp_rule_add(ctx, deny, SCMP_SYS(execve), 1,
                            SCMP_A0(SCMP_CMP_NE, reinterpret_cast<scmp_datum_t>(path)));
    if (rc == 0)
      rc = seccomp_rule_add(ctx, deny, SCMP_SYS(execve), 1,
                            SCMP_A1(SCMP_CMP_NE, reinterpret_cast<scmp_datum_t>(args)));
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  return rc == 0 ? "" : std::string("seccomp: ") + std::strerror(-rc);
}

}  // namespace

std::string SandboxSupport::describe() const {
  std::string out;
  out += seccomp ? "seccomp" : "NO seccomp (processes, exec and ptrace are not blocked)";
  out += landlock_abi > 0 ? ", Landlock ABI " + std::to_string(landlock_abi)
                          : ", NO Landlock (file access is limited only by the user's permissions)";
  if (landlock_abi > 0 && landlock_abi < 6) out += " (signals to other processes not scoped)";
  return out;
}

SandboxSupport probe_sandbox() {
  SandboxSupport s;
  s.landlock_abi = landlock_abi();
  int fds[2];
  if (pipe(fds) != 0) return s;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char ok = 0;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0) {
      scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
      if (ctx && seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ptrace), 0) == 0 &&
          seccomp_load(ctx) == 0)
        ok = 1;
    }
    (void)!write(fds[1], &ok, 1);
    _exit(0);
  }
  close(fds[1]);
  char ok = 0;
  if (pid > 0) {
    (void)!read(fds[0], &ok, 1);
    waitpid(pid, nullptr, 0);
  }
  close(fds[0]);
  s.seccomp = ok == 1;
  return s;
}

std::string enter_sandbox(const SandboxPolicy& policy, char* path, char** args) {
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return std::string("prctl(NO_NEW_PRIVS): ") + std::strerror(errno);
  const int abi = landlock_abi();
  if (abi > 0) {
    std::string err = install_landlock(policy, abi);
    if (!err.empty()) return err;
  }
  std::string err = install_seccomp(policy, path, args);
  // Without seccomp (a kernel or container that refuses filters) the run goes on, as the probe
  // told the grader; any other failure is the launcher's and stops it.
  if (!err.empty() && probe_sandbox().seccomp) return err;
  execve(path, args, environ);
  return std::string("execve(") + path + "): " + std::strerror(errno);
}

}  // namespace dtl::grade
