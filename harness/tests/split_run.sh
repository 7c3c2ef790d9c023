#!/usr/bin/env bash
# split_run.sh MPIRUN-PREFIX... -- BINARY...: the autograder's split run (dtl/harness/observe.hpp)
# of each BINARY against itself: a worker run records every observed value, a driver run of the
# same binary checks them. For a reference build this must pass: any failure is a test whose
# observations are not deterministic (a flow that depends on timing, inputs drawn after code
# that consumes the generator differently) and would cost an honest student points.
# It also fails on any test that ran and observed no result of the code under test: such a test's
# verdict rests on values measured inside the student's process alone (a Comm's counters, a memory
# peak), which code in that process can rewrite, so a submission could pass it without doing the
# work. Every test that checks traffic or memory must also check a result.
set -u
prefix=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do prefix+=("$1"); shift; done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
rc=0
for bin in "$@"; do
  rm -f "$dir"/rank-*.obs
  seed=$((RANDOM * 32768 + RANDOM))
  DTL_SEED=$seed "${prefix[@]}" "$bin" --gtest_color=no --dtl_timeout=90 --dtl_record="$dir" >"$dir/worker.log" 2>&1
  worker=$?
  DTL_SEED=$seed "${prefix[@]}" "$bin" --gtest_color=no --dtl_timeout=90 --dtl_check="$dir" \
    --dtl_check_summary="$dir/summary.json" >"$dir/driver.log" 2>&1
  driver=$?
  # The summary's "in_process_only" array, one quoted name per line (nlohmann's dump(1)).
  in_process=$(awk '/"in_process_only": \[\]/ {exit} /"in_process_only": \[/ {on = 1; next}
                    on && /\]/ {exit} on {gsub(/[ ",]/, ""); print}' "$dir/summary.json" 2>/dev/null)
  if [ "$driver" -ne 0 ] || [ "$worker" -ne 0 ]; then
    echo "split run of $(basename "$bin") (seed $seed): worker exit $worker, driver exit $driver"
    tail -n 60 "$dir/driver.log"
    rc=1
  elif [ -n "$in_process" ]; then
    echo "split run of $(basename "$bin"): these tests observe no result of the code under test" \
         "(their verdict rests on in-process values only):"
    sed 's/^/  /' <<<"$in_process"
    rc=1
  else
    echo "split run of $(basename "$bin"): ok ($(grep -c '"computed"' "$dir/summary.json") tests," \
         "each checks an observed result)"
  fi
done
exit $rc
