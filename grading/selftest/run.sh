#!/usr/bin/env bash
# The grader's own end-to-end test: grades crafted lab-03 submissions through
# `./lab grade --submission` and checks each score and reason in results.json.
# Every class of attack in grading/README.md ("What the grader allows") is in a submission here
# with its expected score and reason (make_submissions.sh lists them; attacks that one audit step
# stops share a submission, and each must be named in its findings).
# Runs in CI through ctest (label grading). To stay within minutes it reuses one scratch
# build for all submissions (DTL_SCRATCH: only the student file recompiles) and grades the
# ring all-reduce group at world sizes up to 2 (3 where a case needs a third rank), which every
# crafted failure affects.
#   DTL_SELFTEST_ONLY="segv deadlock"  runs only those cases (and the Gradescope one if named)
#   DTL_SELFTEST_DIR=DIR               works in DIR and keeps it (logs, results, scratch build)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -n "${DTL_SELFTEST_DIR:-}" ]; then
  work=$DTL_SELFTEST_DIR; mkdir -p "$work"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-grader-selftest-XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
# The student's user must reach the job directories and binaries beneath (Gradescope's
# /autograder is world-traversable too).
chmod 711 "$work"
want() { [ -z "${DTL_SELFTEST_ONLY:-}" ] || [[ " $DTL_SELFTEST_ONLY " == *" $1 "* ]]; }
bash "$root/grading/selftest/make_submissions.sh" "$work/subs"
fails=0
failed=()
export DTL_SCRATCH="$work/scratch"
# As Gradescope grades: student code runs as an unprivileged user when the self-test runs as
# root (CI does); otherwise as the caller, in the same sandbox.
user=""
run_as=()
if [ "$(id -u)" -eq 0 ]; then
  user=dtl-selftest-student
  id -u "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  run_as=(--run-as "$user")
fi

# check VARIANT PERF? JQ-LIKE-CHECKS... : grade one submission and check results.json with
# the grader's own JSON reader (dtl-grade --check), so no jq or python is needed.
# Per-test timeout: generous by default, so a loaded machine (the large-size grading test takes
# 10 s at load 5 on 2 cores) never turns a correct submission into a "hang"; the deadlock
# variant sets TEST_TIMEOUT=8 to be stopped quickly (and MAX_WORLD=2: fewer hangs to wait for).
grade() {  # [TEST_TIMEOUT=S] [MAX_WORLD=N] grade VARIANT [lab grade options]
  local v=$1 start=$SECONDS; shift
  want "$v" || return 0
  echo "==== $v"
  "$root/lab" grade --submission "$work/subs/$v" --json "$work/$v.json" \
    --test-timeout "${TEST_TIMEOUT:-30}" \
    --max-world "${MAX_WORLD:-2}" --only-groups "ring all-reduce" "${run_as[@]}" "$@" \
    >"$work/$v.log" 2>&1
  tail -n 12 "$work/$v.log"
  echo "($v graded in $((SECONDS - start)) s)"
}
expect() {  # expect VARIANT CONDITION MESSAGE: CONDITION is evaluated by dtl-grade --check
  local v=$1 cond=$2
  want "${v%%-lab*}" || want "$v" || return 0
  if "$root/build/bin/dtl-grade" --check "$work/$v.json" --expect "$cond" >>"$work/$v.log" 2>&1; then
    echo "ok   $v: $cond"
  else
    echo "FAIL $v: $cond"; tail -n 40 "$work/$v.log"; fails=$((fails + 1))
    failed+=("$v: $cond")
  fi
}

grade correct --perf-rounds 2
expect correct "score == max"
# Honest standard-library code (threads, shared mutexes, timed waits, fstreams) is part of it:
# full marks, and the file I/O appears in the integrity report only.
expect correct "output contains 'does file I/O'"
expect correct "output contains 'ignored (not in the allow-list): grader_hack.cpp notes.txt'"
# One interleaved round each for the clear-cut performance cases (0.3x, a wrong result); the
# honest submission gets two, so noise cannot push it under the 0.8 threshold.
grade slow --perf-rounds 1
expect slow "correctness == correctness_max"
expect slow "performance == 0"
expect slow "reason contains 'x the reference'"
# A submission that reads which timed run it is in cannot shape the grader's measurement.
grade repcheat --perf-rounds 1
expect repcheat "correctness == correctness_max"
expect repcheat "performance == 0"
# The untouched skeleton is "not started": 0, and nothing is built or run for it.
grade skeleton --no-perf
expect skeleton "score == 0"
expect skeleton "reason contains 'not started'"
if ! want skeleton; then :
elif grep -q "nothing to build" "$work/skeleton.log" && ! grep -q "building lab 03" "$work/skeleton.log"; then
  echo "ok   skeleton: nothing built"
else
  echo "FAIL skeleton: the untouched skeleton was built"; fails=$((fails + 1)); failed+=("skeleton: built")
fi
# --all grades it anyway: every test fails "not implemented" at n=1, and grading stops there.
cp -r "$work/subs/skeleton" "$work/subs/skeleton-all"
grade skeleton-all --no-perf --all
expect skeleton-all "score == 0"
expect skeleton-all "reason contains 'not implemented: lab 03'"
expect skeleton-all "reason contains 'grading stopped at the smallest world size'"
expect skeleton-all "output contains 'larger world sizes not run'"
grade nocompile --no-perf
expect nocompile "score == 0"
expect nocompile "reason contains 'does not compile'"
expect nocompile "output contains 'launch'"
MAX_WORLD=3 grade segv --no-perf
expect segv "score > 0"
expect segv "score < max"
expect segv "reason contains 'crashed at n=3'"
# n=1 passes, n=2 hangs: that is all this variant needs to show (each hang costs the timeout).
TEST_TIMEOUT=8 MAX_WORLD=2 grade deadlock --no-perf
expect deadlock "score > 0"
expect deadlock "score < max"
expect deadlock "reason contains 'hang'"
grade partial --no-perf
expect partial "correctness > 0"
expect partial "score < max"
expect partial "reason contains 'tests fail at n='"
# It fails a hidden (after-due-date) group too: nothing of it (group name, test names, files) may
# appear in the top-level output or a visible test before the due date.
expect partial "output contains 'FAILED GradeRingAllReduce'"
expect partial "hidden stays hidden"

# Cheating: the static audit stops these before any of their code runs, each attack named.
grade cheat-source --no-perf
expect cheat-source "score == 0"
expect cheat-source "reason contains 'rejected by the code audit'"
for finding in "uses compiler attributes" "includes <gtest/gtest-spi.h>" "../../grading/03_ring_allreduce"; do
  expect cheat-source "output contains '$finding'"
done
if want cheat-source && grep -q "building lab 03" "$work/cheat-source.log"; then
  echo "FAIL cheat-source: compiled although its sources were rejected"; fails=$((fails + 1))
  failed+=("cheat-source: compiled")
fi
grade cheat-object --no-perf
expect cheat-object "score == 0"
expect cheat-object "reason contains 'rejected by the code audit'"
for finding in "calls std::basic_ofstream" "calls atexit" "calls MPI_Allreduce" \
               "calls dtl::Comm::all_reduce" "replaces dtl::Comm::barrier" "calls fork" \
               "calls fmt::" "calls at::DynamicLibrary" "calls dtl::Comm::reset_stats" \
               "calls dtl::memory::reset_peak"; do
  expect cheat-object "output contains '$finding'"
done
# A static destructor runs after main returns, after the report: the test main never returns.
MAX_WORLD=1 grade destructor --no-perf
expect destructor "correctness == correctness_max"
# A daemon that escaped its session, with the audit off: the grader kills what its commands leave.
MAX_WORLD=1 grade daemon-noaudit --no-perf --no-audit
expect daemon-noaudit "correctness == correctness_max"
# (This self-test's own processes only: their command lines hold its scratch directory.)
if ! want daemon-noaudit; then :
elif pgrep -f "$work/.*lab03_(test|grade|bench)_student" >/dev/null; then
  echo "FAIL daemon-noaudit: a student process outlived grading"; fails=$((fails + 1))
  failed+=("daemon-noaudit: survived"); pkill -KILL -f "$work/.*lab03_(test|grade|bench)_student"
else
  echo "ok   daemon-noaudit: nothing survived"
fi

# ...and these by what the grader measures.
start=$SECONDS
MAX_WORLD=1 grade benchcheat --perf-rounds 1
expect benchcheat "correctness == correctness_max"
expect benchcheat "performance == 0"
expect benchcheat "output contains 'wrong result'"
if want benchcheat && [ $((SECONDS - start)) -gt 90 ]; then
  echo "FAIL benchcheat: a nearly free call took $((SECONDS - start)) s to benchmark"; fails=$((fails + 1))
  failed+=("benchcheat: slow")
fi
MAX_WORLD=1 grade localsum --perf-rounds 1
expect localsum "correctness == correctness_max"
expect localsum "performance == 0"
expect localsum "output contains 'wrong result'"

echo '{"03": 1}' >"$work/times.json"
# The budget bounds the first job too: its watchdog fits inside the 10 s (the test ends as a
# hang with the harness's diagnosis), and n=2 is not run at all.
start=$SECONDS
MAX_WORLD=2 grade sleepy --no-perf --reference-times "$work/times.json" --budget-min 10
expect sleepy "score < max"
expect sleepy "output contains 'stopped by the watchdog'"
expect sleepy "output contains 'time budget of 10 s for lab 03 used up'"
if want sleepy && [ $((SECONDS - start)) -gt 60 ]; then
  echo "FAIL sleepy: grading took $((SECONDS - start)) s with a budget of 10 s"; fails=$((fails + 1))
  failed+=("sleepy: budget not kept")
fi
MAX_WORLD=1 grade flood --no-perf --output-limit-mb 8
expect flood "score == 0"
expect flood "reason contains 'output reached the limit of 8 MiB'"

# ---- the trust boundary (grading/README.md, "Trust")
grade cheat-asmlabel --no-perf
expect cheat-asmlabel "score == 0"
expect cheat-asmlabel "reason contains 'asm label'"
# The object-level check: a symbol whose name is a shell command is rejected by name, and no
# shell ever sees it (the old audit ran it).
marker=/tmp/dtl-selftest-pwned-$$
if want cheat-asmlabel; then
cat >"$work/label.cpp" <<CPP
namespace dtl::lab03 {
extern "C" int selftest_data __asm__("\\"';touch $marker;'\\"");
int selftest_f() { return selftest_data; }
}  // namespace dtl::lab03
CPP
if c++ -fno-pic -c "$work/label.cpp" -o "$work/label.o" 2>"$work/label.log"; then
  "$root/build/bin/dtl-grade" --source "$root" --labs 03 --audit-object "$work/label.o" >"$work/label.out" 2>&1
  if grep -q "not a name" "$work/label.out" && [ ! -e "$marker" ]; then
    echo "ok   asm label in an object: rejected by name, never run"
  else
    echo "FAIL asm label in an object"; cat "$work/label.out"; fails=$((fails + 1)); failed+=("asm label object")
  fi
  rm -f "$marker"
else
  echo "skip asm label in an object (this assembler refuses the name: $(head -c 200 "$work/label.log"))"
fi
fi
grade cheat-symlink --no-perf
expect cheat-symlink "score == 0"
expect cheat-symlink "output contains 'symbolic link'"
expect cheat-symlink "output contains 'Expected'"
MAX_WORLD=1 grade cheat-process --no-perf
expect cheat-process "score == 0"
expect cheat-process "output contains 'starts or reaches processes'"
grade cheat-private --no-perf
expect cheat-private "score == 0"
expect cheat-private "output contains 'redefined access specifier'"
expect cheat-private "output contains 'explicit instantiation on a member pointer'"
MAX_WORLD=1 grade cheat-report-noaudit --no-perf --no-audit
expect cheat-report-noaudit "score == 0"
# A rank that asks mpirun to start a program: refused (mpirun is sandboxed too). Whatever the
# score (the job may abort), nothing outside the job directory was written.
rm -f /tmp/dtl-selftest-escaped
MAX_WORLD=1 TEST_TIMEOUT=20 grade cheat-spawn-noaudit --no-perf --no-audit
if want cheat-spawn-noaudit; then
  if [ -e /tmp/dtl-selftest-escaped ]; then
    echo "FAIL cheat-spawn-noaudit: a spawned program wrote /tmp/dtl-selftest-escaped"
    fails=$((fails + 1)); failed+=("cheat-spawn-noaudit: escaped"); rm -f /tmp/dtl-selftest-escaped
  else
    echo "ok   cheat-spawn-noaudit: nothing written outside the job"
  fi
fi
# Honest standard-library idioms keep full marks.
MAX_WORLD=1 grade honest-idioms --no-perf
expect honest-idioms "correctness == correctness_max"
expect honest-idioms "correctness > 0"
# The driver reads what the worker left without following links, with caps.
MAX_WORLD=1 grade cheat-stream --no-perf
expect cheat-stream "score == 0"
expect cheat-stream "output contains 'symbolic link'"
for lab in 17 18; do
  want "honest-lab$lab" || continue
  echo "==== honest-lab$lab"
  "$root/lab" grade --submission "$work/subs/honest-lab$lab" --json "$work/honest-lab$lab.json" --no-perf \
    --test-timeout 60 --max-world 1 --only-groups "Task 1" "${run_as[@]}" >"$work/honest-lab$lab.log" 2>&1
  tail -n 6 "$work/honest-lab$lab.log"
  expect "honest-lab$lab" "score == max"
done

# Another lab in the same scratch build: it must be configured for that lab, not report "does not
# compile" because the first lab's DTL_ONLY_LABS stayed.
if want lab01; then
echo "==== lab01"
"$root/lab" grade --submission "$work/subs/lab01" --json "$work/lab01.json" --no-perf \
  --test-timeout 30 --max-world 1 "${run_as[@]}" >"$work/lab01.log" 2>&1
tail -n 4 "$work/lab01.log"
fi
expect lab01 "score == max"

# Gradescope, end to end: run_autograder on a tree laid out as Gradescope lays it out, as root
# with the unprivileged user when the CI runs as root (as Gradescope does).
if want gradescope; then
ag="$work/autograder"
mkdir -p "$ag/submission"
cp "$work/subs/correct/ring_allreduce.cpp" "$ag/submission/"
echo "==== gradescope (user: ${user:-none, not root})"
DTL_AUTOGRADER_ROOT="$ag" DTL_AUTOGRADER_SOURCE="$root" DTL_AUTOGRADER_USER="$user" \
  DTL_GRADE_ARGS="--test-timeout 30 --max-world 2 --no-perf" \
  bash "$root/grading/gradescope/run_autograder" >"$work/gradescope.log" 2>&1
cp "$ag/results/results.json" "$work/gradescope.json" 2>/dev/null
tail -n 12 "$work/gradescope.log"
expect gradescope "correctness == correctness_max"
expect gradescope "correctness > 0"
# What students read is clean: no colour codes, no OpenMPI noise from the unprivileged user.
expect gradescope "output lacks 'Read -1, expected'"
expect gradescope "output lacks '\u001b['"
expect gradescope "hidden stays hidden"
# mpirun's own helpers ending after a correct submission are not "left running" by the student.
if grep -qs "left running" "$work/correct.log" "$work/gradescope.log"; then
  echo "FAIL correct: the grader reports processes left running"; fails=$((fails + 1))
  failed+=("correct: left running")
else
  echo "ok   correct, gradescope: no process reported left running"
fi
# A misnamed upload: nothing graded, and the student is told what was expected and received.
rm -f "$ag/submission/"*
echo "int x;" >"$ag/submission/ring_all_reduce.cc"
DTL_AUTOGRADER_ROOT="$ag" DTL_AUTOGRADER_SOURCE="$root" DTL_AUTOGRADER_USER="$user" \
  DTL_GRADE_ARGS="--no-perf" bash "$root/grading/gradescope/run_autograder" >"$work/misnamed.log" 2>&1
cp "$ag/results/results.json" "$work/misnamed.json" 2>/dev/null
expect misnamed "score == 0"
expect misnamed "reason contains 'Expected'"
expect misnamed "reason contains 'ring_allreduce.cpp'"
expect misnamed "reason contains 'Received: ring_all_reduce.cc'"

fi

echo "grader self-test: $fails failure(s) in $SECONDS s"
for f in "${failed[@]}"; do echo "  FAILED $f"; done
[ "$fails" -eq 0 ]
