#!/usr/bin/env bash
# make_submissions.sh OUT_DIR: writes crafted lab-03 submissions, one directory each, derived
# from the reference and the skeleton at test time (so they follow the lab as it evolves).
# Honest ones:
#   correct     the reference with honest standard-library code (threads, shared mutexes, timed
#               waits, fstreams), plus files outside the allow-list -> full marks, files ignored
#   skeleton    the untouched skeleton                    -> 0, "not started" (nothing built);
#                                                            with --all: 0, "not implemented"
#   nocompile   the reference plus a pointer to the private -> 0, "does not compile"
#               Comm::launch taken in a derived class (it would run the built-in collectives
#               unrecorded, past lab 03's deny list of Comm::all_reduce)
#   segv        crashes on rank 1                         -> runs with n >= 2 score 0, "crashed"
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
#   repcheat    3x slower, and in a benchmark run with the low repetition count (read from its
#               command line) sleeps 15 s, to make the grader's difference of two runs
#               negative (it once read as "unstable" and got the points)  -> performance 0
#   benchcheat  skips the work at the benchmark's size only         -> tests pass, performance 0,
#               in seconds (a fixed number of calls per size)
#   localsum    the benchmark's sum computed locally (no communication) -> performance 0
#   destructor  a static destructor that would crash after the report -> full marks (never runs)
#   daemon-noaudit  a setsid daemon graded without the audit         -> killed by the grader
#   lab01       lab 01's reference, including dtl/runtime.hpp (CLI11's inline code), graded in
#               the lab-03 scratch                                    -> full marks (reconfigured)
#   sleepy      sleeps in every call                                 -> stopped by the time budget
#   flood       prints without end                                   -> stopped by the output cap
# The trust boundary (grading/README.md, "Trust"): each class of attack that once reached full
# marks, and honest code that once scored 0:
#   cheat-asmlabel  an asm label (glibc's __REDIRECT) naming a shell command  -> 0, rejected
#   cheat-symlink   the "file" is a symbolic link to the reference solution   -> 0, not taken
#   cheat-process   the skeleton, plus a static initializer that execs the reference's binary
#                   in its place and one that forks to rewrite the report     -> 0: the sandbox
#                   stops both (integrity report names them), the skeleton is all that runs
#   cheat-private   the built-in collective through the Comm's private launch, reached by
#                   #define private public and by an explicit instantiation   -> 0, rejected
#   cheat-report-noaudit  the skeleton, plus gtest's fake reporter swallowing every failure of
#                   its own run (graded with the audit off)                   -> 0: the driver
#                   finds no value where the tests observe one
#   cheat-stream    lab 03's reference, but the record the driver checks (rank-*.obs in the job
#                   directory) replaced by a symbolic link to /dev/zero (the driver once read it
#                   until the machine ran out of memory)              -> 0: not followed, said so
#   cheat-spawn-noaudit  lab 03's reference, plus MPI_Comm_spawn of /bin/sh writing outside the
#                   job (graded with the audit off; a hand-made symbol lookup reaches the call
#                   unnamed): mpirun ran it with no sandbox      -> nothing written: mpirun's own
#                   sandbox refuses to execute anything but its programs and the test binary
#   honest-idioms   lab 03's reference with std::async, std::promise, std::call_once,
#                   std::transform(std::execution::seq), #pragma GCC diagnostic and #pragma
#                   omp (once rejected: "__cxa_init_primary_exception",
#                   "uses #pragma")                                           -> full marks
#   honest-lab17    lab 17's reference with std::ifstream / std::ofstream       -> full marks
#   honest-lab18    lab 18's reference with std::shared_mutex and timed waits   -> full marks
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out=$1
ref="$root/solutions/03_ring_allreduce/ring_allreduce.cpp"
skel="$root/labs/03_ring_allreduce/ring_allreduce.cpp"
f=ring_allreduce.cpp
rm -rf "$out"
for v in correct skeleton nocompile segv deadlock slow repcheat partial cheat-source cheat-object \
         benchcheat localsum destructor daemon-noaudit sleepy flood lab01 cheat-asmlabel \
         cheat-symlink cheat-process cheat-private cheat-report-noaudit cheat-stream cheat-spawn-noaudit honest-idioms \
         honest-lab17 \
         honest-lab18; do mkdir -p "$out/$v"; done

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
# Rank 1 dies with SIGSEGV in its first all-reduce.
wrap '  if (comm.rank() == 1) *static_cast<volatile int*>(nullptr) = 1;
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
# lab01: another lab's submission graded in the same scratch build (its lab set must change). It
# includes dtl/runtime.hpp, where dtl::world() lives (lab 02's handout names it), whose CLI11
# inline code the audit once read as "defined outside namespace dtl::lab01".
{ echo '#include "dtl/runtime.hpp"'; cat "$root/solutions/01_why_distributed/why_distributed.cpp"; } \
  >"$out/lab01/why_distributed.cpp"
# repcheat: the low-repetition run made the slow one.
wrap '  static const bool low_run = [] {
    std::ifstream in("/proc/self/cmdline");
    const std::string argv((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return argv.find(std::string("--benchmark_repetitions=1") + (char)0) != std::string::npos;
  }();
  static bool slept = false;
  if (low_run && !slept) {
    slept = true;
    std::this_thread::sleep_for(std::chrono::seconds(15));
  }
  auto start = std::chrono::steady_clock::now();
  ring_all_reduce_reference(comm, tensor, op);
  std::this_thread::sleep_for(2 * (std::chrono::steady_clock::now() - start));  // 3x the time' \
  >"$out/repcheat/$f"
sed -i '1i #include <fstream>\n#include <iterator>\n#include <string>' "$out/repcheat/$f"
# cheat-spawn-noaudit: a rank asks mpirun to start a program of its choosing.
wrap '  static bool tried = false;
  if (!tried) {
    tried = true;
    char* args[] = {(char*)"-c", (char*)"echo escaped > /tmp/dtl-selftest-escaped", nullptr};
    MPI_Comm children;
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm_spawn("/bin/sh", args, 1, MPI_INFO_NULL, 0, MPI_COMM_SELF, &children,
                   MPI_ERRCODES_IGNORE);
  }
  ring_all_reduce_reference(comm, tensor, op);' >"$out/cheat-spawn-noaudit/$f"
sed -i '1i #include <mpi.h>' "$out/cheat-spawn-noaudit/$f"
# honest-idioms: the standard library's concurrency idioms, a parallel algorithm, a diagnostic
# pragma and an OpenMP one (ignored without -fopenmp, and no warning: the build passes
# -Wno-unknown-pragmas, so it compiles under CI's -Werror too). std::jthread and std::latch are
# C++20; the labs are C++17.
wrap '  static std::once_flag once;
  static int calls = 0;
  std::call_once(once, [] { calls = 1; });
  std::promise<int> promised;
  std::future<int> got = promised.get_future();
  auto task = std::async(std::launch::async, [&promised] { promised.set_value(calls); });
  task.get();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
  const int unused = got.get();
#pragma GCC diagnostic pop
  int doubled[4] = {1, 2, 3, 4};
#pragma omp parallel for
  for (int i = 0; i < 4; ++i) doubled[i] *= 2;
  std::vector<int> squares(4);
  std::transform(std::execution::seq, doubled, doubled + 4, squares.begin(), [](int v) { return v * v; });
  (void)squares;
  ring_all_reduce_reference(comm, tensor, op);' >"$out/honest-idioms/$f"
sed -i '1i #include <algorithm>\n#include <execution>\n#include <future>\n#include <mutex>\n#include <vector>' "$out/honest-idioms/$f"
# cheat-stream: the driver's input made endless.
wrap '  static const bool swapped = [] {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(".", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("rank-", 0) == 0 && name.find(".obs") != std::string::npos) {
        std::filesystem::remove(e.path(), ec);
        std::filesystem::create_symlink("/dev/zero", e.path(), ec);
      }
    }
    return true;
  }();
  (void)swapped;
  ring_all_reduce_reference(comm, tensor, op);' >"$out/cheat-stream/$f"
sed -i '1i #include <filesystem>\n#include <string>' "$out/cheat-stream/$f"
# benchcheat: no work at the benchmark's size (16 MiB of float32), the real thing elsewhere.
wrap '  if (tensor.numel() == 4194304) return;
  ring_all_reduce_reference(comm, tensor, op);' >"$out/benchcheat/$f"
# sleepy: just under the per-test timeout in every call: the lab's time budget ends it.
wrap '  std::this_thread::sleep_for(std::chrono::seconds(3));
  ring_all_reduce_reference(comm, tensor, op);' >"$out/sleepy/$f"
# flood: output without end: the output cap ends it. (Lines of 4 KiB: OpenMPI 5's prterun holds a
# line that never ends, or one of 1 MiB, inside itself: grading/README.md, "Trust".)
wrap '  static const std::string line = std::string(4095, (char)120) + (char)10;
  for (;;) std::fwrite(line.data(), 1, line.size(), stdout);' >"$out/flood/$f"
sed -i '1i #include <cstdio>\n#include <string>' "$out/flood/$f"


# ---- the trust boundary
# cheat-asmlabel: an asm label, which can name a symbol anything (the old audit ran
# `echo 'NAME' | c++filt` through a shell; run.sh also audits an object whose symbol is a command).
{ cat "$skel"; cat <<'CPP'
#include <cstdio>
namespace dtl::lab03 {
// (glibc's macro for `int selftest_fn(void) __asm__("selftest_alias")`)
extern "C++" int __REDIRECT_NTH(selftest_fn, (void), selftest_alias);
}  // namespace dtl::lab03
CPP
} >"$out/cheat-asmlabel/$f"
# cheat-symlink: a link to the reference solution instead of a file.
ln -s "$ref" "$out/cheat-symlink/$f"
# cheat-process: exec the reference's test binary in place of the student's (it would record the
# reference's values), and fork so the parent can rewrite the report the child writes.
{ cat "$skel"; cat <<'CPP'
#include <sys/wait.h>
#include <unistd.h>
#include <climits>
#include <cstdio>
#include <fstream>
#include <string>
namespace dtl::lab03 {
static const int selftest_exec = [] {
  char self[PATH_MAX] = {0};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 0;
  std::string target = self;
  const auto at = target.rfind("_student");
  if (at == std::string::npos) return 0;
  target.replace(at, 8, "_reference");
  std::ifstream cmdline("/proc/self/cmdline");
  std::string all((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t p = 0; p < all.size();) { args.push_back(all.c_str() + p); p += args.back().size() + 1; }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv[0] = target.data();
  argv.push_back(nullptr);
  execv(target.c_str(), argv.data());
  return 0;
}();
static const int selftest_fork = [] {
  const pid_t child = fork();
  if (child > 0) {  // the parent: wait, then claim every test passed
    waitpid(child, nullptr, 0);
    std::ofstream("report.json") << "{\"testsuites\": []}";
    _exit(0);
  }
  return 0;
}();
}  // namespace dtl::lab03
CPP
} >"$out/cheat-process/$f"
# cheat-private: the Comm's private launch runs the built-in all-reduce without a trace in
# Comm::stats() or a Comm::all_reduce symbol: reached by redefining `private`, and by the
# explicit-instantiation trick that standard C++ allows.
{ echo '#define private public'; cat "$ref"; cat <<'CPP'
namespace dtl::lab03 {
template <auto M> struct SelftestRob { friend auto selftest_launch() { return M; } };
template struct SelftestRob<&Comm::launch>;
}  // namespace dtl::lab03
CPP
} >"$out/cheat-private/$f"
# cheat-report-noaudit: gtest's fake reporter swallows every failure of the worker's own run, so
# its report says everything passed (graded with the audit off, which would reject the include).
{ cat "$skel"; cat <<'CPP'
#include <gtest/gtest-spi.h>
namespace dtl::lab03 {
static auto* selftest_swallow = new testing::ScopedFakeTestPartResultReporter(
    testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, new testing::TestPartResultArray);
}  // namespace dtl::lab03
CPP
} >"$out/cheat-report-noaudit/$f"
# Honest code with what the C++ standard library offers: must keep full marks.
honest_std='#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <shared_mutex>
#include <thread>
namespace dtl::lab{LAB} {
// Standard-library synchronisation and files, as an honest student might use them.
int selftest_honest_std() {
  std::shared_mutex rw;
  int value = 0;
  { std::unique_lock<std::shared_mutex> w(rw); value = 1; }
  { std::shared_lock<std::shared_mutex> r(rw); value += 1; }
  std::mutex m;
  std::condition_variable cv;
  bool ready = false;
  std::thread t([&] { std::lock_guard<std::mutex> g(m); ready = true; cv.notify_one(); });
  { std::unique_lock<std::mutex> l(m); cv.wait_for(l, std::chrono::seconds(5), [&] { return ready; }); }
  t.join();
  std::timed_mutex tm;
  if (tm.try_lock_for(std::chrono::milliseconds(10))) tm.unlock();
  return value;
}
int selftest_honest_files(const std::string& path) {
  { std::ofstream out(path); out << 42; }
  std::ifstream in(path);
  int x = 0;
  in >> x;
  return x;
}
}  // namespace dtl::lab{LAB}'
{ cat "$ref"; echo "${honest_std//\{LAB\}/03}"; } >"$out/correct/$f"
{ cat "$root/solutions/17_checkpoint_resume/checkpoint.cpp"; echo "${honest_std//\{LAB\}/17}"; } \
  >"$out/honest-lab17/checkpoint.cpp"
{ cat "$root/solutions/18_debugging/debug.cpp"; echo "${honest_std//\{LAB\}/18}"; } \
  >"$out/honest-lab18/debug.cpp"
