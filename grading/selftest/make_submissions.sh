#!/usr/bin/env bash
# make_submissions.sh OUT_DIR: writes crafted lab-03 submissions, one directory each, derived
# from the reference and the skeleton at test time (so they follow the lab as it evolves):
#   correct     the reference                             -> full marks
#   skeleton    the untouched skeleton                    -> 0, "not implemented"
#   nocompile   the reference plus a syntax error         -> 0, "does not compile"
#   segv        crashes on rank 2                         -> runs with n >= 3 score 0, "crashed"
#   deadlock    rank 1 skips ring_all_reduce              -> its runs with n >= 2 score 0, "hang"
#   slow        correct but 3x slower                     -> correctness, no performance points
#   fake        the skeleton printing fake gtest success and writing a fake results.json -> 0
#   extra       the reference plus a file outside the allow-list -> full marks, file ignored
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out=$1
ref="$root/solutions/03_ring_allreduce/ring_allreduce.cpp"
skel="$root/labs/03_ring_allreduce/ring_allreduce.cpp"
f=ring_allreduce.cpp
rm -rf "$out"
for v in correct skeleton nocompile segv deadlock slow fake extra; do mkdir -p "$out/$v"; done

cp "$ref" "$out/correct/$f"
cp "$skel" "$out/skeleton/$f"
{ cat "$ref"; echo 'this line is not C++;'; } >"$out/nocompile/$f"

# Rank 2 dies with SIGSEGV as soon as the program starts.
{ cat "$ref"; cat <<'CPP'
#include <csignal>
#include <cstdlib>
static const int selftest_crash = [] {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (r && std::atoi(r) == 2) std::raise(SIGSEGV);
  return 0;
}();
CPP
} >"$out/segv/$f"

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
