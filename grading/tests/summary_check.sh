#!/usr/bin/env bash
# summary_check.sh DTL_GRADE MPIRUN... : the summary that ends `./lab test NN` (dtl-grade
# --summarize), on a real run of the harness's broken fixture at 3 ranks: a test that passes, one
# that fails alike on every rank, one that fails on the last rank only, then one that hangs. The
# summary must keep the tests finished before the hang (the report the watchdog writes), mark the
# hung test, show each failure once with the ranks it happened on, and name the full log.
set -u
grade=$1; shift
work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-summary-check-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/reports"
timeout --kill-after=5 60 "$@" --gtest_filter='BrokenFixture.*' --dtl_timeout=4 \
  --gtest_output="json:$work/reports/fixture.n3.json" >"$work/run.log" 2>&1
"$grade" --reports "$work/reports" --log "$work/run.log" --summarize fixture.n3 fixture.n5 \
  >"$work/summary.txt" 2>&1
rc=$?
cat "$work/summary.txt"
fail() { echo "summary check: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the summary of failing tests exited 0"
has() { grep -Eq -- "$1" "$work/summary.txt" || fail "no line matches: $1"; }
once() {
  [ "$(grep -cF -- "$1" "$work/summary.txt")" = 1 ] || fail "not exactly once: $1"
}
has '^BrokenFixture\.Passes +ok +-$'
has '^BrokenFixture\.LastRankSkipsAllReduce +HANG +-$'
has '^0 of 4 tests pass at every world size'
has '^- = did not run'
has '^BrokenFixture\.EveryRankFailsAlike fails at n=3; first failure at n=3, on all 3 ranks:$'
once 'world size 3, batch 5 (this is rank 0-2)'
has '^BrokenFixture\.LastRankFails fails at n=3; first failure at n=3, on rank 2 of 3:$'
once 'deliberate failure on the last rank'
has '^BrokenFixture\.LastRankSkipsAllReduce hangs at n=3, stopped by the watchdog:$'
has "^    \[dtl watchdog\] hung: .*waiting in all_reduce #2 on comm 'world'"
has '^fixture\.n5: no test report'
has "^full output of every run: $work/run.log\$"
echo "summary check: ok"
