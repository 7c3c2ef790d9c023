#!/usr/bin/env bash
# make_submissions.sh OUT_DIR: writes crafted lab-03 submissions, one directory each, derived
# from the reference and the skeleton at test time (so they follow the lab as it evolves).
# Honest ones:
#   correct     the reference, plus files outside the allow-list -> full marks, files ignored
#   skeleton    the untouched skeleton                    -> 0, "not started" (nothing built);
#                                                            with --all: 0, "not implemented"
#   nocompile   the reference plus a pointer to the private -> 0, "does not compile"
#               Comm::launch taken in a derived class (it would run the built-in collectives
#               unrecorded, past lab 03's deny list of Comm::all_reduce)
#   segv        crashes on rank 2                         -> runs with n >= 3 score 0, "crashed"
#   deadlock    rank 1 skips ring_all_reduce              -> its runs with n >= 2 score 0, "hang"
#   slow        correct but 5x slower (clear of the 0.8 bar on a loaded machine) -> correctness, no performance points
#   partial     wrong for float64 only                    -> partial credit within a run
# Cheating, every class of attack in grading/README.md ("What the grader allows"). The attacks
# that one audit step stops share a submission (each must still be named in the findings):
#   cheat-source  stopped by the source check before anything compiles:
#                 a constructor that rewrites --gtest_filter          (attributes)
#                 gtest's fake result reporter swallowing failures    (gtest include)
#                 printing the solution and the hidden tests          (include of grading/)
#   cheat-object  stopped by the symbol check of the compiled objects:
#                 fake gtest success and planted results files       (calls std::basic_ofstream)
#                 an exit handler that edits the JSON report         (calls atexit)
#                 the result by MPI_Allreduce                        (calls MPI_Allreduce)
#                 the result by the built-in Comm::all_reduce        (lab 03's deny list)
#                 an inline Comm::barrier replacing the runtime's    (replaces)
#                 a setsid daemon to stop the reference's benchmark  (calls fork)
#                 fmt::output_file and at::DynamicLibrary (dlopen)   (escape hatches)
#                 Comm::reset_stats, memory::reset_peak              (measurement tampering)
# and those stopped by what the grader measures:
#   benchcheat  skips the work at the benchmark's size only         -> tests pass, performance 0,
#               in seconds (a fixed number of calls per size)
#   localsum    the benchmark's sum computed locally (no communication) -> performance 0
#   destructor  a static destructor that would crash after the report -> full marks (never runs)
#   daemon-noaudit  a setsid daemon graded without the audit         -> killed by the grader
#   lab01       lab 01's reference graded in the lab-03 scratch       -> full marks (reconfigured)
#   sleepy      sleeps in every call                                 -> stopped by the time budget
#   flood       prints without end                                   -> stopped by the output cap
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out=$1
ref="$root/solutions/03_ring_allreduce/ring_allreduce.cpp"
skel="$root/labs/03_ring_allreduce/ring_allreduce.cpp"
f=ring_allreduce.cpp
rm -rf "$out"
for v in correct skeleton nocompile segv deadlock slow partial cheat-source cheat-object \
         benchcheat localsum destructor daemon-noaudit sleepy flood lab01; do mkdir -p "$out/$v"; done

cp "$ref" "$out/correct/$f"
echo "int main() { return 0; }" >"$out/correct/grader_hack.cpp"
echo "not part of the lab" >"$out/correct/notes.txt"
cp "$skel" "$out/skeleton/$f"
{ cat "$ref"; cat <<'EOF'
namespace dtl::lab03 {
struct LaunchThief : Comm {
  static auto backdoor() { return &LaunchThief::launch; }
};
}  // namespace dtl::lab03
EOF
} >"$out/nocompile/$f"

# Wrap ring_all_reduce: the reference is renamed, a wrapper takes its place.
wrap() {  # wrap BODY
  echo '#define ring_all_reduce ring_all_reduce_reference'
  cat "$ref"
  echo '#undef ring_all_reduce'
  echo '#include <chrono>'
  echo '#include <thread>'
  echo 'namespace dtl::lab03 {'
  echo 'void ring_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {'
  echo "$1"
  echo '}'
  echo '}  // namespace dtl::lab03'
}
# Rank 2 dies with SIGSEGV in its first all-reduce.
wrap '  if (comm.rank() == 2) *static_cast<volatile int*>(nullptr) = 1;
  ring_all_reduce_reference(comm, tensor, op);' >"$out/segv/$f"
wrap '  if (tensor.scalar_type() == torch::kFloat64) return;  // wrong for one dtype only
  ring_all_reduce_reference(comm, tensor, op);' >"$out/partial/$f"
wrap '  if (comm.rank() == 1) return;  // skips the collective: everyone else waits forever
  ring_all_reduce_reference(comm, tensor, op);' >"$out/deadlock/$f"
wrap '  auto start = std::chrono::steady_clock::now();
  ring_all_reduce_reference(comm, tensor, op);
  std::this_thread::sleep_for(4 * (std::chrono::steady_clock::now() - start));  // 5x the time' \
  >"$out/slow/$f"

# ---- cheating: each must be stopped, and for the reason given.
# cheat-source: three attacks that the source check rejects before anything compiles.
{ cat "$skel"; cat <<'CPP'
#include <cstring>
#include <fstream>
#include <iostream>
#include <gtest/gtest-spi.h>
// argv: a constructor runs before main and rewrites the test filter to passing tests only.
__attribute__((constructor)) static void selftest_argv(int argc, char** argv) {
  for (int i = 0; i < argc; ++i)
    if (std::strncmp(argv[i], "--gtest_filter=", 15) == 0) std::strcpy(argv[i] + 15, "None");
}
// reporter: gtest's own fake reporter, installed at static init, swallows every failure.
static auto* selftest_reporter = new testing::ScopedFakeTestPartResultReporter(
    testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, new testing::TestPartResultArray);
// leak: print the reference solution and the hidden tests into a visible test's output.
namespace dtl::lab03 {
static const char* selftest_hidden =
#include "../../grading/03_ring_allreduce/ring_allreduce_grade_test.cpp"
    ;
static const int selftest_leak = [] {
  std::ifstream in("../../solutions/03_ring_allreduce/ring_allreduce.cpp");
  std::cout << in.rdbuf() << selftest_hidden;
  return 0;
}();
}  // namespace dtl::lab03
CPP
} >"$out/cheat-source/$f"

# cheat-object: six attacks that compile cleanly and are rejected by what the objects call or
# define. The wrapper computes the result with MPI and with the built-in all-reduce (plus the
# ring's messages as junk, so Comm::stats() would look right).
wrap '  MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()), MPI_FLOAT,
                MPI_SUM, MPI_COMM_WORLD);
  comm.all_reduce(tensor, op);' >"$out/cheat-object/$f"
sed -i '1i #include <mpi.h>' "$out/cheat-object/$f"
cat >>"$out/cheat-object/$f" <<'CPP'
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <signal.h>
#include <unistd.h>
// fake: prints what a passing gtest run prints and plants results files.
static const int selftest_fake = [] {
  std::printf("[==========] 99 tests from 9 test suites ran.\n[  PASSED  ] 99 tests.\n");
  const char* fake = "{\"score\": 1000, \"tests\": []}";
  std::ofstream("results.json") << fake;
  std::ofstream("../results.json") << fake;
  std::ofstream("/tmp/results.json") << fake;
  return 0;
}();
namespace dtl::lab03 {
// atexit: at exit, rewrite the JSON report the grader asked for, then leave with status 0.
static const int selftest_atexit = [] {
  std::atexit([] {
    std::ofstream("report.json") << "{\"testsuites\": []}";
    std::_Exit(0);
  });
  return 0;
}();
// daemon: a process outside the grader's process group, to SIGSTOP the reference's benchmark.
static const int selftest_daemon = [] {
  if (fork() == 0) {
    setsid();
    for (;;) { kill(-1, SIGSTOP); sleep(1); }
  }
  return 0;
}();
}  // namespace dtl::lab03
// Escape hatches inside allowed namespaces: fmt's files, dlopen/dlsym through ATen.
#include <ATen/DynamicLibrary.h>
#include <fmt/os.h>
#include "dtl/memory.hpp"
namespace dtl::lab03 {
static const int selftest_hatches = [] {
  fmt::output_file("selftest.txt").print("{}", 1);
  at::DynamicLibrary libc("libc.so.6");
  return libc.sym("getpid") != nullptr;
}();
// Measurement tampering: forget the traffic and the memory peak the tests are about to check.
void selftest_forget(Comm& comm) {
  comm.reset_stats();
  memory::reset_peak();
}
}  // namespace dtl::lab03
// interpose: an inline definition of a runtime function wins over the library's at run time
// (the executable comes first in symbol lookup), so the tests' oracle could be replaced.
namespace dtl {
inline void Comm::barrier() {}
}  // namespace dtl
namespace dtl::lab03 {
// Taking its address makes the compiler emit the (weak) out-of-line copy that would interpose.
void (Comm::*selftest_keep)() = &Comm::barrier;
}  // namespace dtl::lab03
CPP

# localsum: at the benchmark's size, the sum computed locally from what the inputs used to be (a
# closed formula of rank and index) instead of communicating.
wrap '  if (tensor.numel() == 4194304) {
    const int64_t n = comm.size();
    tensor.copy_(torch::arange(tensor.numel(), tensor.options()).remainder(7) * n + n * (n + 1) / 2);
    return;
  }
  ring_all_reduce_reference(comm, tensor, op);' >"$out/localsum/$f"
# destructor: a static object of the submission whose destructor would crash the process after
# main returns, i.e. after the test report is written. The test main ends with _Exit: it never
# runs, and the submission gets its full marks.
{ cat "$ref"; cat <<'CPP'
#include <cstdlib>
namespace dtl::lab03 {
namespace {
struct SelftestLate {
  ~SelftestLate() { std::abort(); }
} selftest_late;
}  // namespace
}  // namespace dtl::lab03
CPP
} >"$out/destructor/$f"
# daemon-noaudit: a setsid daemon, graded with the audit off: the grader must kill it anyway.
{ cat "$ref"; cat <<'CPP'
#include <unistd.h>
namespace dtl::lab03 {
static const int selftest_daemon = [] {
  if (fork() == 0) {
    setsid();
    if (fork() == 0) {
      // A real daemon lets go of every descriptor (mpirun's output pipes included, or mpirun
      // would wait for it and the job would time out): it outlives the job unnoticed.
      for (int fd = 0; fd < 1024; ++fd) close(fd);
      for (;;) sleep(1);
    }
    _exit(0);
  }
  return 0;
}();
}  // namespace dtl::lab03
CPP
} >"$out/daemon-noaudit/$f"
# lab01: another lab's submission graded in the same scratch build (its lab set must change).
cp "$root/solutions/01_why_distributed/why_distributed.cpp" "$out/lab01/"
# benchcheat: no work at the benchmark's size (16 MiB of float32), the real thing elsewhere.
wrap '  if (tensor.numel() == 4194304) return;
  ring_all_reduce_reference(comm, tensor, op);' >"$out/benchcheat/$f"
# sleepy: just under the per-test timeout in every call: the lab's time budget ends it.
wrap '  std::this_thread::sleep_for(std::chrono::seconds(3));
  ring_all_reduce_reference(comm, tensor, op);' >"$out/sleepy/$f"
# flood: output without end: the output cap ends it.
wrap '  static const std::string line(1 << 20, (char)120);
  for (;;) std::fwrite(line.data(), 1, line.size(), stdout);' >"$out/flood/$f"
sed -i '1i #include <cstdio>\n#include <string>' "$out/flood/$f"

