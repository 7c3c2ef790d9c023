// sandbox.hpp — defines: SandboxPolicy, SandboxSupport, probe_sandbox, enter_sandbox.
//
// What every process that runs student code lives in. The trusted launcher (dtl-sandbox,
// sandbox_main.cpp) installs it and then executes the test binary, so the student's static
// initializers already run inside it:
//   * Landlock (file system): writes only beneath the job's own directory (and the job's own
//     /dev/shm, where the grader gave it one); reads only what a run needs (system libraries and
//     configuration, /proc, /sys, the binary and the runtime library); on GPUs, reads and writes
//     of the NVIDIA device nodes, which CUDA opens read-write;
//     programs may be executed only from the policy's list; no signal to a process outside the
//     sandbox (ABI 6).
//   * seccomp (system calls): no new programs (execve is allowed exactly once, for the launcher's
//     own hand-over, by the addresses of its arguments), no process creation (threads are clone
//     with CLONE_THREAD and stay allowed), no ptrace or writes into other processes' memory, no
//     io_uring (its operations bypass system-call filters), no namespaces, mounts, BPF, kernel
//     modules or file handles.
// A lab whose tests start jobs of their own (labs 17 and 18: fault injection) gets `processes`:
// fork and execve are then allowed, and Landlock limits what may be executed to mpirun's own
// programs and the test binary.
// A kernel without one of the mechanisms runs without it; probe_sandbox says which, and the
// grader reports it (never silently).
#pragma once

#include <string>
#include <vector>

namespace dtl::grade {

struct SandboxPolicy {
  std::vector<std::string> write;  // directories: everything beneath may be created and written
  std::vector<std::string> read;   // files or directories readable (read-only)
  std::vector<std::string> exec;   // files that may be executed (and read)
  std::vector<std::string> rw;     // files opened for reading and writing, never created:
                                   // device nodes (a directory: the nodes in it, e.g. MIG's)
  bool processes = false;          // fork/exec allowed (exec targets still limited by Landlock)
};

struct SandboxSupport {
  int landlock_abi = 0;  // 0: Landlock unavailable
  bool seccomp = false;
  std::string describe() const;  // "seccomp, Landlock ABI 7" / what is missing and what it means
};

// What this kernel offers (tried in a child process, which is then discarded).
SandboxSupport probe_sandbox();

// Installs the sandbox in this process and executes argv[0] with argv (never returns on
// success). On failure returns an error message. `path` and `args` must stay untouched between
// the filter's installation and the execve (their addresses are what the filter allows).
std::string enter_sandbox(const SandboxPolicy& policy, char* path, char** args);

}  // namespace dtl::grade
