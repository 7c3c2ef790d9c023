#!/usr/bin/env bash
# split_check.sh MODE 'REGEX;...' MPIRUN... FIXTURE: the split run of split_fixture.cpp.
# Runs the worker (DTL_FIXTURE_MODE=MODE, --dtl_record) and then the driver (honest,
# --dtl_check). MODE honest: the driver must pass. Otherwise the driver must fail and its output
# match every REGEX (grep -E), while the worker's own report, for MODE cheat, claims success.
set -u
mode=$1; patterns=$2; shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "split_check: FAIL: $*"; exit 1; }
# One seed for both runs, new each time: the driver draws the inputs the worker drew.
seed=$((RANDOM * 32768 + RANDOM))
DTL_SEED=$seed DTL_FIXTURE_MODE=$mode timeout 60 "$@" --dtl_record="$dir" >"$dir/worker.log" 2>&1
worker=$?
echo "---- worker ($mode), exit $worker"; tail -n 5 "$dir/worker.log"
[ "$mode" != cheat ] || [ "$worker" -eq 0 ] || fail "the cheating worker's own run should claim success"
DTL_SEED=$seed timeout 60 env DTL_FIXTURE_MODE=honest "$@" --dtl_check="$dir" --dtl_check_summary="$dir/summary.json" \
  >"$dir/driver.log" 2>&1
driver=$?
echo "---- driver, exit $driver"; cat "$dir/driver.log"
if [ "$mode" = honest ]; then
  [ "$driver" -eq 0 ] || fail "the driver failed an honest worker"
  grep -q '"computed"' "$dir/summary.json" || fail "no summary"
else
  [ "$driver" -ne 0 ] || fail "the driver passed a $mode worker"
  IFS=';' read -r -a regexes <<<"$patterns"
  for re in "${regexes[@]}"; do
    grep -Eq -- "$re" "$dir/driver.log" || fail "driver output does not match: $re"
  done
fi
echo "split_check: OK ($mode)"
