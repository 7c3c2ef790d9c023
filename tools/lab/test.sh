# shellcheck shell=bash
# ./lab test: the whole suite as CI runs it, or one lab's tests with a summary. Sourced by ./lab
# (its helpers: build, mpi_env, say, die, norm, lab_dir, BUILD, JOBS, GPU; gpu_count from
# gpu_check.sh).

cmd_test() {
  local labs=() side=student regex=() leave_out=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --solutions|--reference) side=reference ;;
      --student) side=student ;;
      --gpu) GPU=1; BUILD="$ROOT/build-gpu" ;;
      -R) regex=(-R "$2"); shift ;;
      -E) leave_out=$2; shift ;;
      [0-9]|[0-9][0-9]) labs+=("$(norm "$1")") ;;
      *) die "test: unknown argument '$1' (see ./lab help)" ;;
    esac
    shift
  done
  mpi_env
  local ctest=(ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" --no-tests=error)
  local exclude=()
  if [ "$GPU" = 1 ]; then
    local n; n=$(gpu_count)
    [ "$n" -gt 0 ] || die "--gpu: no GPU visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}; nvidia-smi -L lists none)"
    export DTL_DEVICE=cuda
    # One GPU per rank: skip world sizes above the GPU count (tests are named NAME.nK), and
    # the old registration of nccl_tests (common/CMakeLists.txt) in favour of gpu.nccl.nK.
    local big="" k
    for k in $(seq $((n + 1)) 64); do big+="${big:+|}\\.n$k\$"; done
    exclude=(-E "${big:+$big|}watchdog|^nccl\\.n")
  fi
  if [ "$GPU" = 1 ] && [ ${#labs[@]} -eq 0 ]; then
    build
    say "running the GPU tests (NCCL on CUDA tensors, one GPU per rank) on $n GPU(s)"
    "${ctest[@]}" -L '^gpu$' "${regex[@]}" "${exclude[@]}"
  elif [ ${#labs[@]} -eq 0 ]; then
    local t0=$SECONDS
    build
    local built=$((SECONDS - t0))
    say "running the suite: runtime, harness, reference solutions, skeleton check, grader"
    # Each lab's split run (labNN.split.n2) runs its reference and grading tests at 2 ranks as the
    # autograder does, and fails if they fail: their plain 2-rank entries would run them again.
    [ ${#exclude[@]} -gt 0 ] ||
      exclude=(-E "^lab[0-9]+\\.(reference|grading)\\.n2\$${leave_out:+|$leave_out}")
    local rc=0
    "${ctest[@]}" -L 'common|harness|reference|skeleton|grading' "${regex[@]}" "${exclude[@]}" || rc=$?
    # Where CI's time goes, in its log (ctest's own summary above times each test).
    say "suite: build ${built} s, tests $((SECONDS - t0 - built)) s"
    return "$rc"
  else
    local targets=() names=""
    for n in "${labs[@]}"; do
      lab_dir "$n" >/dev/null
      targets+=("lab${n}_test_${side}")
      [ "$side" = reference ] && targets+=("lab${n}_grade_reference")
      names+="${names:+|}${n}"
    done
    build "${targets[@]}" dtl-grade
    # The runs' full output (every rank's failures, ctest's dump of each failing run) goes to a
    # log; the terminal gets one line per run, then the summary: each test by world size, and
    # each failing test's first failure, once.
    local log; log="$BUILD/test-logs/lab$(IFS=-; echo "${labs[*]}").$side.log"
    mkdir -p "$BUILD/test-logs"
    say "testing the ${side} build of lab(s) ${labs[*]} (full output: $log)"
    # Labels pick the labs and the side (every -L must match); -R stays the user's filter.
    local select=(-L "^lab(${names})\$" -L "^${side}\$" "${regex[@]}" "${exclude[@]}")
    local entries
    entries=$(ctest --test-dir "$BUILD" -N "${select[@]}" | sed -n 's/^ *Test *#[0-9]*: *//p')
    for e in $entries; do rm -f "$BUILD/test-reports/$e.json"; done
    local rc
    set +e
    "${ctest[@]}" "${select[@]}" 2>&1 | tee "$log" | grep --line-buffered -E '^ *[0-9]+/[0-9]+ +Test +#'
    rc=${PIPESTATUS[0]}
    set -e
    if [ -z "$entries" ]; then cat "$log"; return "$rc"; fi
    # The split run (labNN.split.n2, --solutions) reruns the same tests as the autograder runs
    # them, and writes no report of its own: ctest's line above is its verdict.
    local shown; shown=$(tr ' ' '\n' <<<"$entries" | grep -v '\.split\.' || true)
    # shellcheck disable=SC2086
    "$BUILD/bin/dtl-grade" --reports "$BUILD/test-reports" --log "$log" --summarize $shown || true
    return "$rc"
  fi
}
