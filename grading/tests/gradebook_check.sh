#!/usr/bin/env bash
# gradebook_check.sh DTL_GRADE: the gradebook of ./lab grade-class (dtl-grade --gradebook) on a
# crafted class folder: a row per student and lab, each lab's score the sum of its tests, the
# first test that lost points as the reason, and a grading that did not finish (a killed job,
# results missing, a results.json that is a link) never a score: no 0, the reason, a non-zero exit.
set -u
grade=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-gradebook-check-XXXXXX")
trap 'rm -rf "$work"' EXIT
c="$work/class"
mkdir -p "$c/ada" "$c/bob" "$c/cy" "$c/dee" "$c/eve, jr" "$c/.reference"
# ada: both labs, full marks; bob: lab 03 loses points in its second group (with a comma and a
# quote in the message), lab 01 not in the upload (0 of the class's maximum for it); cy: killed by Slurm; dee: graded, but its
# results.json is a link to another file; eve: graded, results missing.
cat >"$c/ada/results.json" <<'J'
{"score": 130, "tests": [
 {"name": "lab 01 | formulas (n=1)", "number": "01.1", "score": 60, "max_score": 60, "output": "2/2 tests pass"},
 {"name": "lab 01 | train (n=2)", "number": "01.2", "score": 30, "max_score": 30, "output": "1/1 tests pass"},
 {"name": "lab 03 | ring (n=2)", "number": "03.1", "score": 30, "max_score": 30, "output": "ok"},
 {"name": "lab 03 | performance: ring", "number": "03.p1", "score": 10, "max_score": 10, "output": "meets the target"},
 {"name": "grading notes (instructors only)", "number": "0.n", "score": 0, "max_score": 0, "output": "sandbox"}]}
J
cat >"$c/bob/results.json" <<'J'
{"score": 12.5, "output": "lab 01: no files", "tests": [
 {"name": "lab 03 | ring (n=1)", "number": "03.1", "score": 10, "max_score": 10, "output": "ok"},
 {"name": "lab 03 | ring: two (n=2)", "number": "03.2", "score": 2.5, "max_score": 20, "output": "Expected \"sum\", got 3, not 4\nsecond line"},
 {"name": "lab 03 | bad input (n=2)", "number": "03.3", "score": 0, "max_score": 5, "output": "later failure"}]}
J
cp "$c/ada/results.json" "$c/other.json"
ln -s "$c/other.json" "$c/dee/results.json"
for s in ada bob dee; do printf 'status=graded\nkey=1\n' >"$c/$s/state"; done
printf 'status=graded\nkey=1\n' >"$c/eve, jr/state"
printf 'status=not-graded\nkey=1\nwhy=Slurm job 41_2 ended TIMEOUT before the grading finished\n' >"$c/cy/state"
"$grade" --gradebook "$c" --labs 1 3 --csv "$work/gb.csv" --summary "$work/summary.md" >"$work/out.txt" 2>&1
rc=$?
cat "$work/gb.csv"
fail() { echo "gradebook check: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "a class with ungraded students exited 0"
has() { grep -qxF -- "$1" "$work/gb.csv" || fail "no row: $1"; }
[ "$(wc -l <"$work/gb.csv")" = 11 ] || fail "not a header and 10 rows (5 students x 2 labs)"
has 'student,lab,score,max,status,reason'
has 'ada,01,90,90,graded,'
has 'ada,03,40,40,graded,'
has 'bob,03,12.5,35,graded,"lab 03 | ring: two (n=2): Expected ""sum"", got 3, not 4"'
has 'bob,01,0,90,graded,nothing of lab 01 in the submission'
has 'cy,01,,,not graded,Slurm job 41_2 ended TIMEOUT before the grading finished'
has 'cy,03,,,not graded,Slurm job 41_2 ended TIMEOUT before the grading finished'
has 'dee,03,,,not graded,results.json missing or unreadable'
has '"eve, jr",03,,,not graded,results.json missing or unreadable'
grep -q '^## Not graded: 3' "$work/summary.md" || fail "the summary does not count 3 students not graded"
grep -q '^- 1 x lab 03 | ring: two$' "$work/summary.md" || fail "the summary's commonest failure is not bob's group (a name with a colon)"
echo "gradebook check: ok"
