#!/usr/bin/env bash
# expect_failure.sh LIMIT_SECONDS 'REGEX;REGEX;...' COMMAND...
# Negative test driver: runs COMMAND (an mpirun of a deliberately broken test) and passes only
# if it exits non-zero before LIMIT_SECONDS and its output matches every REGEX (grep -E).
set -u
limit=$1; patterns=$2; shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
fail() { echo "expect_failure: FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0; it must fail"
[ "$elapsed" -lt "$limit" ] || fail "the job hung until the outer timeout ($limit s)"
IFS=';' read -r -a regexes <<<"$patterns"
for re in "${regexes[@]}"; do
  grep -Eq -- "$re" "$out" || fail "output does not match: $re"
done
echo "expect_failure: OK (exit $rc after ${elapsed}s)"
