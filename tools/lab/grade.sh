# Sourced by ./lab (which provides say, die, clock, configure, build, norm, grader, mpi_env, ROOT,
# BUILD and the rest of its helpers): ./lab grade and submit: grading your labs, or a submission in a
# scratch copy of the repository.

# ---------------------------------------------------------------- grading

cmd_grade() {
  local labs=() side=student json="$ROOT/results.json" submission="" extra=() run_as="" all=0
  local times="${DTL_REFERENCE_TIMES:-$BUILD/reference-times.json}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --solutions|--reference) side=reference ;;
      --submission) submission=$(cd "$2" && pwd) || die "grade: no directory $2"; shift ;;
      --json) json=$2; shift ;;
      --no-perf) extra+=(--no-perf) ;;
      --all) extra+=(--all); all=1 ;;
      --run-as) extra+=(--run-as "$2"); run_as=$2; shift ;;
      --test-timeout|--timeout|--perf-rounds|--perf-max-rounds|--max-world|--only-groups|--budget-min|--output-limit-mb|--memory-limit-mb)
        extra+=("$1" "$2"); shift ;;
      --reference-times) times=$2; shift ;;
      --no-audit) extra+=(--no-audit) ;;
      --note) extra+=(--note "$2"); shift ;;
      [0-9]|[0-9][0-9]) labs+=("$(norm "$1")") ;;
      *) die "grade: unknown argument '$1' (see ./lab help)" ;;
    esac
    shift
  done
  case "$json" in /*) ;; *) json="$PWD/$json" ;; esac
  case "$times" in /*) ;; *) times="$PWD/$times" ;; esac
  # A submission graded as root runs as an unprivileged user, never as root: the sandbox's
  # file rules and the PID namespace assume its processes cannot undo them (grading/README.md).
  if [ -n "$submission" ] && [ "$(id -u)" -eq 0 ] && [ -z "$run_as" ]; then
    run_as=${DTL_STUDENT_USER:-dtl-student}
    id -u "$run_as" >/dev/null 2>&1 ||
      useradd --system --no-create-home --shell /usr/sbin/nologin "$run_as" ||
      die "grade: a submission graded as root runs as an unprivileged user, and '$run_as' could not be created (pass --run-as USER)"
    say "grading the submission as the unprivileged user '$run_as' (--run-as to choose another)"
    extra+=(--run-as "$run_as")
  fi
  [ -n "$submission" ] && {
    DTL_REFERENCE_TIMES="$times" grade_submission "$submission" "$json" "${labs[@]}" -- "${extra[@]}"
    return
  }

  configure
  local rubric_list; rubric_list=$(grader --source "$ROOT" --list)
  [ ${#labs[@]} -gt 0 ] || read -ra labs <<<"$(awk '{print $1}' <<<"$rubric_list" | tr '\n' ' ')"
  [ ${#labs[@]} -gt 0 ] || die "grade: no lab has a rubric yet"
  local logs="$BUILD/grade-logs"; mkdir -p "$logs"
  local known; known=$(ninja -C "$BUILD" -t targets all 2>/dev/null | sed 's/:.*//')
  # Labs whose files are still the untouched skeleton score 0 without a build or a run
  # (grading/README.md); --all grades them anyway.
  local untouched=""
  if [ "$side" = student ] && [ "$all" = 0 ]; then
    untouched=" $("$BUILD/bin/dtl-grade" --source "$ROOT" --untouched --labs "${labs[@]}" | tr '\n' ' ')"
  fi
  local k=0 to_build=() skipped=()
  for n in "${labs[@]}"; do
    grep -q "^$n " <<<"$rubric_list" || die "grade: lab $n has no grading/${n}_*/rubric.json"
    if [[ "$untouched" == *" $n "* ]]; then skipped+=("$n"); else to_build+=("$n"); fi
  done
  [ ${#skipped[@]} -eq 0 ] ||
    say "lab(s) ${skipped[*]}: not started (the files are the untouched skeleton): nothing to build or run"
  for n in "${to_build[@]}"; do
    k=$((k + 1))
    local mine=("lab${n}_test_${side}" "lab${n}_grade_${side}" "lab${n}_bench_${side}")
    # The reference's binaries give the expected test lists and the performance baseline
    # (a student release has none: then the public tests are all there is).
    local targets=() t
    for t in "${mine[@]}" "lab${n}_test_reference" "lab${n}_grade_reference" "lab${n}_bench_reference"; do
      grep -qx "$t" <<<"$known" && [[ " ${targets[*]} " != *" $t "* ]] && targets+=("$t")
    done
    # Code the audit rejects from its sources alone is not even compiled.
    if [ "$side" = student ] && [[ " ${extra[*]} " != *" --no-audit "* ]] &&
       ! "$BUILD/bin/dtl-grade" --source "$ROOT" --labs "$n" --audit-sources >"$logs/lab$n.log" 2>&1; then
      say "lab $n: rejected by the code audit (log: $logs/lab$n.log)"
      rm -f "${mine[@]/#/$BUILD/bin/}"
      continue
    fi
    # Build each lab on its own: one lab that does not compile must not stop the others.
    say "[$k/${#to_build[@]}] building lab $n ($side)"
    build_quietly "$logs/lab$n.log" "${targets[@]}" || {
      say "lab $n: build failed (log: $logs/lab$n.log)"
      # Never grade a binary left over from an earlier build of other code.
      rm -f "${mine[@]/#/$BUILD/bin/}"
    }
  done
  mpi_env
  # Student code as another user (Gradescope): it may run the binaries and load the runtime,
  # never read the sources, the solutions or the hidden tests' binaries.
  [ -n "$run_as" ] && lock_down "$run_as"
  say "grading lab(s) ${labs[*]}"
  "$BUILD/bin/dtl-grade" --source "$ROOT" --build "$BUILD" --labs "${labs[@]}" --side "$side" \
    --json "$json" --build-logs "$logs" \
    --reference-times "$times" "${extra[@]}"
}

# lock_down USER: this tree and its build become unreadable to USER except for what running
# the student's binaries needs: execute (not read) the student binaries and the sandbox launcher,
# read the shared libraries. The reference binaries, the sources, the solutions and the hidden
# tests stay out of reach.
lock_down() {
  chmod -R go-rwx "$ROOT"
  local d="$BUILD/bin"
  while [ "$d" != / ]; do chmod o+x "$d" 2>/dev/null || true; d=$(dirname "$d"); done
  find "$BUILD/bin" -maxdepth 1 -type f -perm -u+x \( -name '*_student' -o -name dtl-sandbox \) \
    -exec chmod o+x {} +
  find "$BUILD" -name '*.so*' -type f -exec chmod o+r {} + \
    -exec sh -c 'd=$(dirname "$1"); while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done' _ {} \;
}

# Grade the files of a submission directory in a scratch copy of the repository: only the
# rubrics' allow-listed student files are taken; headers, tests and rubrics stay pristine.
grade_submission() {
  local dir=$1 json=$2; shift 2
  local labs=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do labs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  extra=("$@")
  configure
  local rubric_list; rubric_list=$(grader --source "$ROOT" --list)
  # DTL_SCRATCH=DIR keeps the scratch copy and its build between runs: grading many
  # submissions in a row then recompiles only the student files.
  local scratch="${DTL_SCRATCH:-}"
  if [ -n "$scratch" ]; then mkdir -p "$scratch"; else scratch=$(mktemp -d "${TMPDIR:-/tmp}/dtl-submission-XXXXXX"); fi
  say "scratch copy: $scratch"
  # A file edited while it is read (exit status 1) is no reason to stop: the copy holds one of
  # its versions, and only the submission's files, copied in below, are graded.
  { tar -C "$ROOT" --exclude='./build*' --exclude='./.git' --exclude='./results*.json' \
      --warning=no-file-changed -cf - . || [ $? -eq 1 ]; } | tar -C "$scratch" -xf -
  # Restored pristine files keep old times; make sure the build sees every student file anew.
  while read -r n slug files; do
    for f in $files; do
      if [ -f "$scratch/labs/$slug/$f" ]; then touch "$scratch/labs/$slug/$f"; fi
    done
  done <<<"$rubric_list"
  # Intake (dtl-grade --intake): regular files only, never through a link, read as the student's
  # user when there is one; every other file of the submission is named, not taken.
  local run_as_arg=() a prev=""
  for a in "${extra[@]}"; do [ "$prev" = --run-as ] && run_as_arg=(--run-as "$a"); prev=$a; done
  local intake touched=() ignored=() refused=() expected=() asked=() kind rest
  # The intake reads the submission as that user: it must be able to reach it.
  if [ ${#run_as_arg[@]} -gt 0 ] && command -v runuser >/dev/null &&
     ! runuser -u "${run_as_arg[1]}" -- test -r "$dir" -a -x "$dir" 2>/dev/null; then
    die "grade: the submission $dir is not readable by the unprivileged user '${run_as_arg[1]}', who reads it (a submission is never read as root): move it somewhere that user can reach, or chmod o+rX it and the folders above it"
  fi
  intake=$("$BUILD/bin/dtl-grade" --source "$scratch" --intake "$dir" --into "$scratch" "${run_as_arg[@]}") ||
    die "grade: cannot read the submission $dir"
  while IFS= read -r line; do
    kind=${line%% *}; rest=${line#* }
    case "$kind" in
      used) [[ " ${touched[*]} " == *" ${rest%% *} "* ]] || touched+=("${rest%% *}") ;;
      ignored) ignored+=("$rest") ;;
      refused) refused+=("$rest") ;;
      expected) expected+=("$rest") ;;
    esac
  done <<<"$intake"
  if [ ${#labs[@]} -eq 0 ]; then
    labs=("${touched[@]}")
  else
    # Labs asked for (a Gradescope assignment pinned to one lab): an upload with none of their
    # files is explained below, not graded as an untouched skeleton.
    local n files_of; asked=("${labs[@]}"); labs=() expected=()
    for n in "${asked[@]}"; do
      [[ " ${touched[*]} " == *" $n "* ]] && labs+=("$n")
      files_of=$(grep "^$n " <<<"$rubric_list" | cut -d' ' -f3-) || true
      read -ra files_of <<<"$files_of"; expected+=("${files_of[@]}")
    done
  fi
  local notes=()
  [ ${#ignored[@]} -gt 0 ] && notes+=(--note "ignored (not in the allow-list): ${ignored[*]}")
  local r; for r in "${refused[@]}"; do notes+=(--note "not taken: $r"); done
  if [ ${#labs[@]} -eq 0 ]; then
    # A wrongly named upload: say what was expected and what came, in results.json too.
    local received msg which="a lab's files"
    [ ${#asked[@]} -gt 0 ] && which="the files of lab ${asked[*]}"
    received=$( (cd "$dir" && find . -mindepth 1 \( -type f -o -type l \) -printf '%P ' | head -c 2000) )
    msg="Nothing was graded: the submission has none of the files a lab is graded on.
Expected ($which, at the top of the upload or under labs/NN_slug/): ${expected[*]}
Received: ${received:-nothing}"
    for r in "${refused[@]}"; do msg+=$'\n'"Not taken: $r"; done
    "$BUILD/bin/dtl-grade" --no-grade "$msg" --json "$json"
    [ -n "${DTL_SCRATCH:-}" ] || rm -rf "$scratch"
    return 3
  fi
  say "grading lab(s) ${labs[*]} of the submission"
  local rc=0
  DTL_CMAKE_ARGS="${DTL_CMAKE_ARGS:-} -DDTL_ONLY_LABS=$(IFS=';'; echo "${labs[*]}")" \
    "$scratch/lab" grade "${labs[@]}" --json "$json" "${notes[@]}" "${extra[@]}" || rc=$?
  [ -n "${DTL_SCRATCH:-}" ] || rm -rf "$scratch"
  return $rc
}

cmd_submit() {
  [ $# -ge 1 ] || die "submit: which labs? (./lab submit NN ...)"
  configure
  local rubric_list; rubric_list=$(grader --source "$ROOT" --list)
  local files=() out="$ROOT/dtl-submission.zip"
  for a in "$@"; do
    local n; n=$(norm "$a")
    local line; line=$(grep "^$n " <<<"$rubric_list") || die "submit: lab $n has no rubric"
    read -r _ slug list <<<"$line"
    for f in $list; do files+=("labs/$slug/$f"); done
  done
  rm -f "$out"
  cmake -E tar cf "$out" --format=zip "${files[@]}"
  say "wrote $out: ${files[*]}"
}
