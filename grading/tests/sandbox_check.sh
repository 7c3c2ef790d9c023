#!/usr/bin/env bash
# sandbox_check.sh SANDBOX PROBE MPIRUN...: runs sandbox_probe inside dtl-sandbox under the
# grader's policy for student runs and asserts what it may and may not do; then an MPI job of
# two ranks under the same policy (the labs' runs must still work inside it).
set -u
sandbox=$1; probe=$2; shift 2
job=$(mktemp -d); secret=$(mktemp); devices=$(mktemp -d)
trap 'rm -rf "$job" "$secret" "$devices"' EXIT
touch "$devices/nvidia0"  # stands in for a GPU's device node (the grader grants those with --rw)
echo "answer" >"$secret"
fail() { echo "sandbox_check: FAIL: $*"; exit 1; }
support=$("$sandbox" --probe); echo "kernel: $support"
out=$("$sandbox" --write "$job" --read /usr --read /lib --read /lib64 --read /etc --read /proc \
      --read /dev --rw "$devices/nvidia0" -- "$probe" "$job" "$secret" "$devices/nvidia0" 2>&1)
echo "$out"
expect() { grep -qx "$1 $2.*" <<<"$out" || fail "$1 should be $2"; }
expect thread allowed
expect write-job-dir allowed
expect read-system allowed
expect rw-device allowed
if grep -q '"seccomp": true' <<<"$support"; then
  for what in exec fork ptrace process_vm_writev io_uring; do expect "$what" denied; done
fi
if ! grep -q '"landlock_abi": 0' <<<"$support"; then
  expect write-outside denied
  expect read-forbidden denied
  expect create-beside-device denied
fi
if grep -Eq '"landlock_abi": ([6-9]|[1-9][0-9])' <<<"$support"; then expect signal-outside denied; fi
echo "sandbox_check: OK"
