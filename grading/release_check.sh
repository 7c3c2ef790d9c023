#!/usr/bin/env bash
# The instructor CI's proof that a student release works: release labs 01-03 with lab 01's
# solution published into a temporary directory, check what it holds and what it does not, then
# run the released tree's own CI (.ci/run: its runtime and harness tests, the published
# reference, every skeleton check, its rubrics' validation) and `./lab grade` on the untouched
# skeleton.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-release-check-XXXXXX")
trap 'rm -rf "$work"' EXIT
rel="$work/release"
fail() { echo "release check FAILED: $*" >&2; exit 1; }

"$root/lab" release "$rel" --labs 01-03 --publish-solutions 01
# What a student must get, and what they must not.
for f in lab .ci/run common/CMakeLists.txt harness/CMakeLists.txt grading/src/main.cpp \
         labs/01_why_distributed/why_distributed.cpp labs/03_ring_allreduce/tests \
         solutions/01_why_distributed/why_distributed.cpp grading/03_ring_allreduce/rubric.json \
         notes/03-ring-allreduce.md; do
  [ -e "$rel/$f" ] || fail "missing $f"
done
for f in solutions/02_data_parallel solutions/03_ring_allreduce labs/04_ddp notes/04-ddp.md \
         grading/selftest grading/gradescope grading/release_check.sh; do
  [ ! -e "$rel/$f" ] || fail "must not contain $f"
done
if find "$rel/grading" -name '*_test.cpp' | grep -q .; then fail "contains hidden tests"; fi
grep -q '"autograder_only_points"' "$rel/grading/03_ring_allreduce/rubric.json" ||
  fail "lab 03's rubric was not reduced to its public part"
grep -q '| 04 |.*not released yet' "$rel/labs/SYLLABUS.md" || fail "the syllabus lists lab 04 as available"
[ -z "$(git -C "$rel" status --porcelain)" ] || fail "the release is not a clean git repository"

# The release's own CI, exactly what a student's clone runs (the runtime and labs come from
# ccache: same relative paths): it must be green on day one.
cd "$rel"
.ci/run || fail "the released tree's own .ci/run failed"
# ./lab grade on the untouched skeleton: "not started", nothing built; with --all, 0 with "not
# implemented"; both say what is hidden.
./lab grade 01 --json "$work/r.json" >"$work/grade.log" 2>&1 || true
grep -q 'not started' "$work/grade.log" || { cat "$work/grade.log"; fail "grade did not report the untouched skeleton as not started"; }
grep -q 'graded by the course' "$work/grade.log" || { cat "$work/grade.log"; fail "grade did not say what the autograder adds"; }
./lab grade 01 --all --json "$work/r.json" >"$work/grade-all.log" 2>&1 || true
grep -q 'not implemented: lab 01' "$work/grade-all.log" || { cat "$work/grade-all.log"; fail "grade --all did not report the skeleton"; }
echo "release check: ok"
