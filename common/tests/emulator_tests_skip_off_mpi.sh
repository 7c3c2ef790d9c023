#!/usr/bin/env bash
# ctest common.emulator_tests_skip_off_mpi: every lab test that turns the network emulator on
# (SlowLinks, NetGuard, net::set) and then measures time (trace events, timers, fits) must skip
# itself off the MPI backend, as lab 07's FitAlphaBeta does: the emulator shapes MPI transfers
# only, and on NCCL an op neither pays the emulated cost nor blocks the host, so such a test
# fails on every GPU run (./lab gpu-check). Tests that only read the emulator's cost formulas
# need no skip. Usage: emulator_tests_skip_off_mpi.sh REPO
set -euo pipefail
repo=${1:-.}
bad=$(for f in "$repo"/labs/*/tests/*_test.cpp; do
  awk -v file="${f#"$repo"/}" '
    function check() {
      if (name != "" && body ~ /(SlowLinks|NetGuard|net::set\()/ &&
          body ~ /(trace::events|Timer|now_seconds|seconds\(\)|fit_emulated_link|measure\()/ &&
          body !~ /backend\(\) != "mpi"/) print file ": " name
    }
    /^TEST(_F)?\(/ { check(); name = $0; sub(/^TEST(_F)?\(/, "", name); sub(/\).*/, "", name);
                     sub(/, */, ".", name); body = ""; next }
    { body = body "\n" $0 }
    END { check() }' "$f"
done)
if [ -n "$bad" ]; then
  echo "these lab tests time the network emulator but do not skip off the MPI backend"
  echo "(add: if (comm->backend() != \"mpi\") GTEST_SKIP() << \"the network emulator shapes the MPI backend only\";):"
  echo "$bad" | sed 's/^/  /'
  exit 1
fi
echo "every lab test that times the network emulator skips off the MPI backend ($(ls "$repo"/labs/*/tests/*_test.cpp | wc -l) files)"
