# Sourced by ./lab (which provides say, die, clock, configure, build, norm, grader, mpi_env, ROOT,
# BUILD and the rest of its helpers): ./lab run, debug and bench.

# ---------------------------------------------------------------- commands


run_mpi() {  # run_mpi RANKS EXE ARGS...
  local n=$1; shift
  mpi_env
  say "mpirun -n $n $(basename "$1") ${*:2}"
  exec "${MPIRUN[@]}" -n "$n" "$@"
}

cmd_run() {
  [ $# -ge 1 ] || die "run: which lab? (./lab run NN)"
  local n; n=$(norm "$1"); shift
  lab_dir "$n" >/dev/null
  local ranks="" side=student args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) ranks=$2; shift ;;
      --solutions|--reference) side=reference ;;
      --) shift; args+=("$@"); break ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  build "lab${n}_run_${side}"
  # The lab's own default (DEMO_RANKS in its CMakeLists.txt), else 2.
  [ -n "$ranks" ] || ranks=$(cat "$BUILD/bin/lab${n}.demo_ranks" 2>/dev/null || echo 2)
  run_mpi "$ranks" "$BUILD/bin/lab${n}_run_${side}" "${args[@]}"
}

cmd_debug() {  # the analyzer of lab 18, on dumps a job left behind; files only, no mpirun
  local dir="" side=student
  while [ $# -gt 0 ]; do
    case "$1" in
      --solutions|--reference) side=reference ;;
      *) [ -z "$dir" ] || die "debug: one directory (./lab debug DIR)"; dir=$1 ;;
    esac
    shift
  done
  [ -n "$dir" ] || die "debug: which directory? (./lab debug DIR, DIR holding a job's rank-*.json dumps)"
  [ -d "$dir" ] || die "debug: $dir is not a directory"
  build "lab18_run_${side}" >/dev/null
  exec "$BUILD/bin/lab18_run_${side}" --analyze "$dir"
}

cmd_bench() {
  [ $# -ge 1 ] || die "bench: which lab? (./lab bench NN, ./lab bench comm, ./lab bench peers)"
  local what=$1; shift
  local ranks=2 side=student args=()
  [ "$what" = peers ] && side=default
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) ranks=$2; shift ;;
      --solutions|--reference) side=reference ;;
      --student) side=student ;;
      --) shift; args+=("$@"); break ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  [ "$what" = peers ] && { bench_peers "$side" "${args[@]}"; return; }
  local target
  if [ "$what" = comm ]; then
    target=comm_bench
  elif [ "$what" = net ]; then
    target=net_probe
  else
    local n; n=$(norm "$what"); lab_dir "$n" >/dev/null
    target="lab${n}_bench_${side}"
  fi
  build "$target"
  run_mpi "$ranks" "$BUILD/bin/$target" "${args[@]}"
}

# ./lab bench peers: the course's GPT and lab 04's DDP against the same model in PyTorch
# (labs/04_ddp/peers/compare.py). Optional: without a Python that imports torch it says how to
# get one and succeeds.
bench_peers() {
  local side=$1; shift
  local py="" c
  for c in ${DTL_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then py=$c; break; fi
  done
  if [ -z "$py" ]; then
    say "bench peers: no Python with PyTorch found (tried ${DTL_PYTHON:+$DTL_PYTHON, }python3, /usr/bin/python3); skipped"
    echo "  install Debian's (the same LibTorch 1.13 as the C++ build): sudo apt-get install python3-torch" >&2
    echo "  or point DTL_PYTHON at a python3 that has torch" >&2
    return 0
  fi
  # The reference DDP when this checkout has it (yours: --student).
  [ "$side" = default ] && { [ -d "$ROOT/solutions/04_ddp" ] && side=reference || side=student; }
  build "lab04_run_${side}"
  mpi_env
  say "bench peers: lab04_run_${side} vs PyTorch $("$py" -c 'import torch; print(torch.__version__)') (interleaved rounds)"
  "$py" "$ROOT/labs/04_ddp/peers/compare.py" --cpp "$BUILD/bin/lab04_run_${side}" \
    --mpirun "${MPIRUN[*]}" "$@"
}
