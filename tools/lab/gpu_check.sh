# Sourced by ./lab (which provides say, die, clock, build, configure, mpi_env, ROOT, BUILD and the
# rest of its helpers): ./lab gpu-check, the first run on a GPU machine.

# GPUs this process may use: CUDA_VISIBLE_DEVICES when set (CUDA stops at its first invalid
# entry, so "", "-1" or "none" hide every GPU), bounded by what nvidia-smi lists; else nvidia-smi.
gpu_count() {
  local listed="" n=0 d ids=()
  command -v nvidia-smi >/dev/null && listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ -z "${CUDA_VISIBLE_DEVICES+set}" ]; then echo "${listed:-0}"; return; fi
  IFS=',' read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
  for d in "${ids[@]}"; do
    d="${d// /}"
    if [[ "$d" =~ ^[0-9]+$ ]]; then
      [ -z "$listed" ] || [ "$d" -lt "$listed" ] || break
    elif [[ ! "$d" =~ ^(GPU|MIG)- ]]; then
      break
    fi
    n=$((n + 1))
  done
  [ -n "$listed" ] && [ "$n" -gt "$listed" ] && n=$listed
  echo "$n"
}

# ---------------------------------------------------------------- GPU smoke test

# The first run on a GPU machine: every GPU-only behaviour of the NCCL backend (notes/gpu.md).
cmd_gpu_check() {
  local n; n=$(gpu_count)
  [ "$n" -gt 0 ] || die "gpu-check: no GPU visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}; nvidia-smi -L lists none); nothing to check"
  # shellcheck disable=SC2034  # GPU: read by configure (./lab)
  GPU=1; BUILD="$ROOT/build-gpu"
  export DTL_CMAKE_ARGS="${DTL_CMAKE_ARGS:-} -DDTL_REQUIRE_GPU=ON"
  [ -f "$BUILD/build.ninja" ] && cmake "$BUILD" -DDTL_REQUIRE_GPU=ON >/dev/null
  build  # everything: the NCCL tests, the smoke suite and every lab (their tests run below)
  mpi_env
  export DTL_DEVICE=cuda
  local sizes=() k exe log line st name rc=0 problems=() tests=()
  local -A result=() seen=()
  for k in 1 2 3 4 8; do [ "$k" -le "$n" ] && sizes+=("$k"); done
  local logs="$BUILD/gpu-check"; mkdir -p "$logs"
  for k in "${sizes[@]}"; do
    for exe in nccl_tests nccl_smoke; do
      log="$logs/$exe.n$k.log"
      say "gpu-check: $exe on $k GPU(s) (log: $log)"
      if ! timeout 1800 "${MPIRUN[@]}" -n "$k" "$BUILD/bin/$exe" --device cuda --gtest_color=no \
             --dtl_timeout=300 >"$log" 2>&1; then
        rc=1; problems+=("$exe on $k GPU(s) exited non-zero: see $log")
      fi
      grep -q '^\[==========\] .* ran\.' "$log" ||
        { rc=1; problems+=("$exe on $k GPU(s) ran no tests: see $log"); }
      while IFS= read -r line; do
        case "$line" in
          "[       OK ] "*) st=pass ;;
          "[  FAILED  ] "*) st=FAIL ;;
          "[  SKIPPED ] "*) st=skip ;;
          *) continue ;;
        esac
        name=${line#*] }; name=${name%% *}; name=${name%,}
        [[ "$name" == *.* ]] || continue
        [ -n "${seen[$name]:-}" ] || { tests+=("$name"); seen[$name]=1; }
        result[$name/$k]=$st
      done <"$log"
    done
  done
  # Every lab's reference and grading tests on CUDA (the Runtime reads DTL_DEVICE=cuda): the
  # same assertions as the CPU run, one row per lab and side.
  local max_lab_ranks=4 pattern sizes_re
  sizes_re=$(for k in "${sizes[@]}"; do [ "$k" -le "$max_lab_ranks" ] && printf '%s|' "$k"; done)
  sizes_re=${sizes_re%|}
  pattern="^lab[0-9][0-9]\\.(reference|grading)\\.n($sizes_re)\$"
  log="$logs/labs.log"
  say "gpu-check: the labs' reference and grading tests on CUDA (log: $log)"
  # --no-tests=error: a pattern that matches nothing is a failure, not a pass.
  ctest --test-dir "$BUILD" -R "$pattern" --output-on-failure --timeout 900 --no-tests=error \
    >"$log" 2>&1 || { rc=1; problems+=("lab tests failed on CUDA (or none ran): see $log"); }
  while IFS= read -r line; do
    [[ "$line" =~ Test\ +\#[0-9]+:\ (lab[0-9]+\.[a-z]+)\.n([0-9]+)\ .*(Passed|\*\*\*[A-Za-z]+|Failed) ]] || continue
    name=${BASH_REMATCH[1]}; k=${BASH_REMATCH[2]}
    [ "${BASH_REMATCH[3]}" = Passed ] && st=pass || st=FAIL
    [ -n "${seen[$name]:-}" ] || { tests+=("$name"); seen[$name]=1; }
    result[$name/$k]=$st
  done <"$log"
  printf '\n%-66s' "test \\ GPUs"; for k in "${sizes[@]}"; do printf '%6s' "$k"; done; printf '\n'
  local unchecked=()  # tests that skipped (or did not run) at every size: nothing was checked
  for name in "${tests[@]}"; do
    printf '%-66s' "$name"
    local ran=0
    for k in "${sizes[@]}"; do
      st=${result[$name/$k]:--}
      [ "$st" = FAIL ] && rc=1
      [ "$st" = pass ] || [ "$st" = FAIL ] && ran=1
      printf '%6s' "$st"
    done
    printf '\n'
    [ "$ran" -eq 1 ] || unchecked+=("$name")
  done
  printf '(pass: passed, skip: not applicable at that size, -: did not run, e.g. after a crash)\n'
  [ ${#problems[@]} -eq 0 ] || printf '  %s\n' "${problems[@]}"
  [ "$rc" -eq 0 ] || die "gpu-check: FAILED"
  if [ ${#unchecked[@]} -gt 0 ]; then
    say "gpu-check: passed on ${sizes[*]} GPU(s), but ${#unchecked[@]} test(s) skipped at every size were not checked (more GPUs needed?): ${unchecked[*]}"
  else
    say "gpu-check: everything passed on ${sizes[*]} GPU(s)"
  fi
}
