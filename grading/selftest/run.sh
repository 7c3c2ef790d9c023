#!/usr/bin/env bash
# The grader's own end-to-end test: grades crafted lab-03 submissions through
# `./lab grade --submission` and checks each score and reason in results.json.
# Runs in CI through ctest (label grading). To stay within minutes it reuses one scratch
# build for all submissions (DTL_SCRATCH: only the student file recompiles) and grades the
# ring all-reduce groups at world sizes up to 3, which every crafted failure affects.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-grader-selftest-XXXXXX")
trap 'rm -rf "$work"' EXIT
bash "$root/grading/selftest/make_submissions.sh" "$work/subs"
fails=0
export DTL_SCRATCH="$work/scratch"

# check VARIANT PERF? JQ-LIKE-CHECKS... : grade one submission and check results.json with
# the grader's own JSON reader (dtl-grade --check), so no jq or python is needed.
grade() {  # grade VARIANT [lab grade options]
  local v=$1; shift
  echo "==== $v"
  "$root/lab" grade --submission "$work/subs/$v" --json "$work/$v.json" --test-timeout 8 \
    --max-world 3 --only-groups "ring all-reduce" "$@" >"$work/$v.log" 2>&1
  tail -n 12 "$work/$v.log"
}
expect() {  # expect VARIANT CONDITION MESSAGE: CONDITION is evaluated by dtl-grade --check
  local v=$1 cond=$2
  if "$root/build/bin/dtl-grade" --check "$work/$v.json" --expect "$cond" >>"$work/$v.log" 2>&1; then
    echo "ok   $v: $cond"
  else
    echo "FAIL $v: $cond"; tail -n 40 "$work/$v.log"; fails=$((fails + 1))
  fi
}

grade correct
expect correct "score == max"
grade slow
expect slow "correctness == correctness_max"
expect slow "performance == 0"
expect slow "reason contains 'x the reference'"
grade skeleton --no-perf
expect skeleton "score == 0"
expect skeleton "reason contains 'not implemented: lab 03'"
grade nocompile --no-perf
expect nocompile "score == 0"
expect nocompile "reason contains 'does not compile'"
expect nocompile "output contains 'error'"
grade segv --no-perf
expect segv "score > 0"
expect segv "score < max"
expect segv "reason contains 'crashed at n=3'"
grade deadlock --no-perf
expect deadlock "score > 0"
expect deadlock "score < max"
expect deadlock "reason contains 'hang'"
grade fake --no-perf
expect fake "score == 0"
grade extra --no-perf
expect extra "correctness == correctness_max"
expect extra "output contains 'ignored (not in the allow-list): grader_hack.cpp notes.txt'"

echo "grader self-test: $fails failure(s)"
[ "$fails" -eq 0 ]
