#!/usr/bin/env bash
# make_submissions.sh OUT_DIR: writes crafted lab-03 submissions, one directory each, derived
# from the reference and the skeleton at test time (so they follow the lab as it evolves).
# Honest ones:
#   correct     the reference                             -> full marks
#   skeleton    the untouched skeleton                    -> 0, "not implemented"
#   nocompile   the reference plus a syntax error         -> 0, "does not compile"
#   segv        crashes on rank 2                         -> runs with n >= 3 score 0, "crashed"
#   deadlock    rank 1 skips ring_all_reduce              -> its runs with n >= 2 score 0, "hang"
#   slow        correct but 3x slower                     -> correctness, no performance points
#   partial     wrong for float64 only                    -> partial credit within a run
#   extra       the reference plus a file outside the allow-list -> full marks, file ignored
# Cheating ones, one per class of attack (grading/README.md, "What the grader allows"):
#   fake        prints fake gtest success, plants results files    -> 0 (audit: files)
#   argv        a constructor rewrites --gtest_filter               -> 0 (audit: attributes)
#   reporter    gtest's fake result reporter swallows failures      -> 0 (audit: gtest include)
#   atexit      an exit handler edits the JSON report, then _Exit   -> 0 (audit: atexit, files)
#   mpi         the result by MPI_Allreduce, junk sends for stats() -> 0 (audit: MPI_*)
#   builtin     the result by the built-in Comm::all_reduce         -> 0 (audit: lab 03's deny list)
#   interpose   an inline Comm::all_reduce replaces the tests' oracle -> 0 (audit: replaces)
#   daemon      a setsid daemon to stop the reference's benchmark  -> 0 (audit: fork, kill)
#   leak        prints the solution and the hidden tests            -> 0 (audit: include, files)
#   benchcheat  skips the work at the benchmark's size only         -> tests pass, performance 0
#   sleepy      sleeps in every call                                 -> stopped by the time budget
#   flood       prints without end                                   -> stopped by the output cap
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out=$1
ref="$root/solutions/03_ring_allreduce/ring_allreduce.cpp"
skel="$root/labs/03_ring_allreduce/ring_allreduce.cpp"
f=ring_allreduce.cpp
rm -rf "$out"
for v in correct skeleton nocompile segv deadlock slow partial fake extra argv reporter atexit mpi \
         builtin interpose daemon leak benchcheat sleepy flood; do mkdir -p "$out/$v"; done

cp "$ref" "$out/correct/$f"
cp "$skel" "$out/skeleton/$f"
{ cat "$ref"; echo 'this line is not C++;'; } >"$out/nocompile/$f"

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
  std::this_thread::sleep_for(2 * (std::chrono::steady_clock::now() - start));  // 3x the time' \
  >"$out/slow/$f"

# Fake success: prints what a passing gtest run prints and plants results files.
{ cat "$skel"; cat <<'CPP'
#include <cstdio>
#include <fstream>
static const int selftest_fake = [] {
  std::printf("[==========] 99 tests from 9 test suites ran.\n[  PASSED  ] 99 tests.\n");
  const char* fake = "{\"score\": 1000, \"tests\": []}";
  std::ofstream("results.json") << fake;
  std::ofstream("../results.json") << fake;
  std::ofstream("/tmp/results.json") << fake;
  return 0;
}();
CPP
} >"$out/fake/$f"

cp "$ref" "$out/extra/$f"
echo "int main() { return 0; }" >"$out/extra/grader_hack.cpp"
echo "not part of the lab" >"$out/extra/notes.txt"

# ---- cheating: each must be stopped, and for the reason given.
# argv: a constructor runs before main and rewrites the test filter to passing tests only.
{ cat "$skel"; cat <<'CPP'
#include <cstring>
__attribute__((constructor)) static void selftest_argv(int argc, char** argv) {
  for (int i = 0; i < argc; ++i)
    if (std::strncmp(argv[i], "--gtest_filter=", 15) == 0) std::strcpy(argv[i] + 15, "None");
}
CPP
} >"$out/argv/$f"
# reporter: gtest's own fake reporter, installed at static init, swallows every failure.
{ cat "$skel"; cat <<'CPP'
#include <gtest/gtest-spi.h>
static auto* selftest_reporter = new testing::ScopedFakeTestPartResultReporter(
    testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, new testing::TestPartResultArray);
CPP
} >"$out/reporter/$f"
# atexit: at exit, rewrite the JSON report the grader asked for, then leave with status 0.
{ cat "$skel"; cat <<'CPP'
#include <cstdlib>
#include <fstream>
namespace dtl::lab03 {
static const int selftest_atexit = [] {
  std::atexit([] {
    std::ofstream("report.json") << "{\"testsuites\": []}";
    std::_Exit(0);
  });
  return 0;
}();
}  // namespace dtl::lab03
CPP
} >"$out/atexit/$f"
# mpi: the answer from MPI, plus the ring's messages as junk so Comm::stats() looks right.
wrap '  MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()), MPI_FLOAT,
                MPI_SUM, MPI_COMM_WORLD);' >"$out/mpi/$f"
sed -i '1i #include <mpi.h>' "$out/mpi/$f"
# builtin: the lab is to build the all-reduce; calling the built-in one is not that.
wrap '  comm.all_reduce(tensor, op);' >"$out/builtin/$f"
# interpose: an inline definition of the runtime's Comm::all_reduce wins over the library's at
# run time, so the tests' oracle would agree with anything.
{ cat "$ref"; cat <<'CPP'
namespace dtl {
inline void Comm::all_reduce(const torch::Tensor&, ReduceOp) {}
}  // namespace dtl
namespace dtl::lab03 {
// Taking its address makes the compiler emit the (weak) out-of-line copy that would interpose.
void (Comm::*selftest_keep)(const torch::Tensor&, ReduceOp) = &Comm::all_reduce;
}  // namespace dtl::lab03
CPP
} >"$out/interpose/$f"
# daemon: a process outside the grader's process group, to SIGSTOP the reference's benchmark.
{ cat "$ref"; cat <<'CPP'
#include <signal.h>
#include <unistd.h>
namespace dtl::lab03 {
static const int selftest_daemon = [] {
  if (fork() == 0) {
    setsid();
    for (;;) { kill(-1, SIGSTOP); sleep(1); }
  }
  return 0;
}();
}  // namespace dtl::lab03
CPP
} >"$out/daemon/$f"
# leak: print the reference solution and the hidden tests into a visible test's output.
{ cat "$ref"; cat <<'CPP'
#include <fstream>
#include <iostream>
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
} >"$out/leak/$f"
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

