#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2034  # helpers and values used inside the eval'd checks below
# grading/selftest/class_check.sh [--slurm | --slurm-if-root] [--small]: ./lab grade-class on a class of five, the
# way an instructor grades a folder of submissions, locally and (--slurm) through a real one-node
# Slurm (./lab slurm up; root, or an instructor's own daemons: see tools/lab/slurm.sh).
#
# --small (CI, grading.class): ada and eve, lab 03's ring all-reduce tests only; no gradings one
# by one and no time-limit case (a grading this short may end inside a minute).
#
# The class (lab 03 from grading/selftest/make_submissions.sh, lab 01 from its reference):
#   ada   the references of labs 01 and 03 (a folder)    -> the references' marks in both
#   bob   lab 03 wrong for float64 only (a zip)           -> lab 03 between 0 and the reference's
#   cy    lab 03 crashing on rank 1, lab 01's reference   -> lab 03 below, lab 01 the reference's
#   dee   lab 03 whose rank 1 never joins (a hang)        -> lab 03 below the reference's, in minutes
#   eve   lab 03 that does not compile                    -> lab 03: 0
# (Graded quickly: no performance checks, world sizes 1-2, a hang stopped after 8 s; a
# performance check skipped still counts in the maximum, so the references' marks are below it.)
# Checked: the gradebook's rows (a row per student and lab; the scores above, against ada's
# references; ada and dee as `./lab grade --submission` grades them one by one; each student's
# rows add up to their results.json), a rerun grades nothing, a changed submission alone is
# graded again. With --slurm: the batch scripts' launch path runs a 4-rank lab (srun --mpi=pmix
# and mpirun inside the allocation: slurm/ranks-check.sbatch); the same scores through Slurm as
# locally; a job cancelled mid-run (scancel) and one over its time limit are "not graded" (never
# 0) and graded on the rerun.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
slurm=0 small=0
for a in "$@"; do
  case "$a" in
    --slurm) slurm=1 ;;
    --slurm-if-root) [ "$(id -u)" = 0 ] && slurm=1 ;;  # CI: Slurm where this check can install it
    --small) small=1 ;;
    *) echo "class_check.sh: unknown option '$a' (--slurm, --slurm-if-root, --small)" >&2; exit 2 ;;
  esac
done
work="${DTL_CLASS_CHECK_DIR:-$root/build/class-check}"
lab="${DTL_LAB:-$root/lab}"
# Quick gradings: no performance checks, world sizes 1-2, a hang stopped after 8 s.
opts=(--no-perf --max-world 2 --test-timeout 8)
students=(ada bob cy dee eve) labs=(01 03)
if [ "$small" = 1 ]; then
  opts+=(--only-groups "ring all-reduce")
  students=(ada eve) labs=(03)
fi
fail=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; fail=1; fi
}
# The score, max and status of a gradebook row; a lab's sum in a results.json.
row() { awk -F, -v s="$1" -v l="$2" '$1 == s && $2 == l { print $3 "|" $4 "|" $5; exit }' "$3"; }
score() { row "$@" | cut -d'|' -f1; }
graded() { [ "$(row "$@" | cut -d'|' -f3)" = graded ]; }
lab_sum() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("%g" % round(sum(t.get("score", 0) for t in d["tests"] if t.get("number", "").startswith(sys.argv[2] + ".")), 2))' "$1" "$2"
}
cmp_num() { awk -v a="$1" -v b="$2" "BEGIN { exit !(a $3 b) }"; }
not_graded() { [ "$(row "$1" "$2" "$3")" = "||not graded" ] && grep -q "^$1,$2,,,not graded,.*$4" "$3"; }
# Each student's rows add up to the total of their results.json.
sums_agree() {
  local out=$1 s total json
  for s in "${students[@]}"; do
    total=$(awk -F, -v s="$s" '$1 == s { t += $3 } END { printf "%.2f", t }' "$out/gradebook.csv")
    json=$(python3 -c 'import json, sys; print("%.2f" % json.load(open(sys.argv[1]))["score"])' "$out/$s/results.json")
    [ "$total" = "$json" ] || { echo "  $s: gradebook $total, results.json $json"; return 1; }
  done
}
scores() { cut -d, -f1-4 "$1" | sort; }

rm -rf "$work"; mkdir -p "$work/made" "$work/class"
bash "$root/grading/selftest/make_submissions.sh" "$work/made" >/dev/null
mkdir -p "$work/class/ada" "$work/class/eve"
cp "$work/made/correct/ring_allreduce.cpp" "$work/class/ada/"
cp "$work/made/nocompile/ring_allreduce.cpp" "$work/class/eve/"
if [ "$small" = 0 ]; then
  mkdir -p "$work/class/cy" "$work/class/dee" "$work/bob"
  cp "$work/made/partial/ring_allreduce.cpp" "$work/bob/"
  (cd "$work/bob" && cmake -E tar cf "$work/class/bob.zip" --format=zip ring_allreduce.cpp)
  cp "$root/solutions/01_why_distributed/why_distributed.cpp" "$work/class/ada/"
  cp "$work/made/segv/ring_allreduce.cpp" "$work/class/cy/"
  cp "$root/solutions/01_why_distributed/why_distributed.cpp" "$work/class/cy/"
  cp "$work/made/deadlock/ring_allreduce.cpp" "$work/class/dee/"
fi
chmod -R a+rX "$work"

start=$SECONDS
"$lab" grade-class "$work/class" "${labs[@]}" --out "$work/local" -- "${opts[@]}" || true
local_s=$((SECONDS - start))
csv="$work/local/gradebook.csv"
rows=$(( ${#students[@]} * ${#labs[@]} ))
check "a row per student and lab" test "$(tail -n +2 "$csv" | wc -l)" = "$rows"
check "every submission graded" eval '[ "$(grep -c ",graded," "$csv")" = "$rows" ]'
if [ "$small" = 0 ]; then
  # Two of them graded one by one, as `./lab grade --submission` grades a single submission.
  for s in ada dee; do
    "$lab" grade 01 03 --submission "$work/class/$s" --json "$work/$s.json" "${opts[@]}" >"$work/$s.log" 2>&1 || true
  done
  full03=$(lab_sum "$work/ada.json" 03) full01=$(lab_sum "$work/ada.json" 01)
  check "the gradebook agrees with gradings one by one (ada, dee)" eval '
    [ "$(score ada 03 "$csv")" = "$full03" ] && [ "$(score ada 01 "$csv")" = "$full01" ] &&
    [ "$(score dee 03 "$csv")" = "$(lab_sum "$work/dee.json" 03)" ] && [ "$(score dee 01 "$csv")" = "$(lab_sum "$work/dee.json" 01)" ]'
  check "ada (the references) scores points in both labs" eval 'cmp_num "$full03" 0 ">" && cmp_num "$full01" 0 ">"'
else
  full03=$(score ada 03 "$csv")
  check "ada (the reference) scores points" cmp_num "${full03:-0}" 0 ">"
fi
if [ "$small" = 0 ]; then
  check "bob (wrong for float64, a zip): lab 03 between 0 and the reference" eval 'cmp_num "$(score bob 03 "$csv")" 0 ">" && cmp_num "$(score bob 03 "$csv")" "$full03" "<"'
  check "cy (crashes on rank 1): lab 03 below the reference, lab 01 the reference's" eval 'cmp_num "$(score cy 03 "$csv")" "$full03" "<" && [ "$(score cy 01 "$csv")" = "$full01" ]'
  check "dee (a rank that never joins): lab 03 below the reference" cmp_num "$(score dee 03 "$csv")" "$full03" "<"
fi
check "eve (does not compile): lab 03 is 0" eval '[ "$(score eve 03 "$csv")" = 0 ] && graded eve 03 "$csv"'
check "each student's rows add up to their results.json" sums_agree "$work/local"
out=$("$lab" grade-class "$work/class" "${labs[@]}" --out "$work/local" -- "${opts[@]}" 2>&1 || true)
check "a rerun grades nothing" grep -q "0 to grade" <<<"$out"
echo "// changed" >>"$work/class/eve/ring_allreduce.cpp"
out=$("$lab" grade-class "$work/class" "${labs[@]}" --out "$work/local" -- "${opts[@]}" 2>&1 || true)
check "a changed submission alone is graded again" grep -q "1 to grade" <<<"$out"

if [ "$slurm" = 1 ]; then
  # The references' own times, measured once per class folder and kind of node, are this node's:
  # the Slurm classes below take the local class's instead of grading the references again.
  for d in slurm cancel timeout; do
    mkdir -p "$work/$d/.reference" && cp "$work/local/.reference/"*.json "$work/$d/.reference/" 2>/dev/null || true
  done
  # A Slurm this check started is stopped at its end; one already running is left as it was.
  "$lab" slurm status >/dev/null 2>&1 || trap '"$lab" slurm down' EXIT
  "$lab" slurm up
  eval "$("$lab" slurm env)"
  DTL_CLASS_CPUS="$(nproc)"  # a one-node cluster of this machine's cores
  export DTL_CLASS_CPUS
  # The batch scripts' launch path (dtl_launch, slurm/env.sh): a 4-rank lab through srun
  # --mpi=pmix and through mpirun inside the allocation, each one world of 4 ranks.
  # What it runs: a fresh checkout has built only what the gradings above needed.
  cmake --build "$root/build" --target lab03_test_reference lab03_run_reference >/dev/null
  (cd "$root" && sbatch --ntasks=4 --overcommit --wait --output="$work/ranks-check.out" \
     slurm/ranks-check.sbatch >/dev/null 2>&1) || true
  cat "$work/ranks-check.out" 2>/dev/null || true
  check "the batch scripts' launch: 4 ranks, one world, the tests pass" eval '
    ! grep -q "^FAILED" "$work/ranks-check.out" && grep -q "^ok: mpirun: one world of 4 ranks" "$work/ranks-check.out" &&
    { ! srun --mpi=list 2>&1 | grep -qw pmix || grep -q "^ok: srun: one world of 4 ranks" "$work/ranks-check.out"; }'
  start=$SECONDS
  "$lab" grade-class "$work/class" "${labs[@]}" --out "$work/slurm" --slurm -- "${opts[@]}" || true
  slurm_s=$((SECONDS - start))
  check "Slurm: the same scores as graded locally" diff <(scores "$csv") <(scores "$work/slurm/gradebook.csv")
  # One submission, its job cancelled while it grades; then over a 1-minute time limit.
  mkdir -p "$work/one"; cp -r "$work/class/ada" "$work/one/"
  "$lab" grade-class "$work/one" 03 --out "$work/cancel" --slurm -- "${opts[@]}" >"$work/cancel.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do
    squeue -h -t R -n dtl-grade -o %i | grep -q . && break; sleep 1
  done
  # Cancelled while it grades: as soon as its build of lab 03 has begun (a fixed 10 s once came
  # after the end: a warm slot grades ada in 10 s on a quick 2-core machine).
  for _ in $(seq 600); do
    grep -qs "building lab 03" "$work/cancel/ada/log" && break; sleep 0.2
  done
  scancel -n dtl-grade
  wait "$pid" || true
  check "a cancelled job: not graded, CANCELLED" not_graded ada 03 "$work/cancel/gradebook.csv" CANCELLED
  "$lab" grade-class "$work/one" 03 --out "$work/cancel" --slurm -- "${opts[@]}" || true
  check "... and graded on the rerun" eval '[ "$(score ada 03 "$work/cancel/gradebook.csv")" = "$full03" ]'
  if [ "$small" = 0 ]; then
    # Over a one-minute limit whatever the machine's speed: dee's rank 1 never joins, and with a
    # per-test timeout of 150 s its first hang outlasts the limit (a warm slot grades ada in less
    # than a minute). The rerun, with the usual 8 s, grades it.
    mkdir -p "$work/slow"; cp -r "$work/class/dee" "$work/slow/"
    "$lab" grade-class "$work/slow" 03 --out "$work/timeout" --slurm --time 1 -- \
      --no-perf --max-world 2 --test-timeout 150 || true
    check "over the time limit: not graded, TIMEOUT" not_graded dee 03 "$work/timeout/gradebook.csv" TIMEOUT
    "$lab" grade-class "$work/slow" 03 --out "$work/timeout" --slurm -- "${opts[@]}" || true
    check "... and graded on the rerun" eval 'graded dee 03 "$work/timeout/gradebook.csv" && [ "$(score dee 03 "$work/timeout/gradebook.csv")" = "$(score dee 03 "$csv")" ]'
  fi
fi
echo "class check: local $local_s s${slurm_s:+, Slurm $slurm_s s}: $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
