# Sourced by ./lab (which provides say, die, clock, configure, build, norm, grader, ROOT, BUILD,
# JOBS): ./lab grade-class, a whole class's submissions graded locally or one Slurm job each.

# ---------------------------------------------------------------- grading a class

# ./lab grade-class DIR NN [NN ...] [options] [-- ./lab grade options]
#
# DIR holds one submission per student: a folder or a .zip each (an LMS download), or
# Gradescope's "Export submissions" (submission_metadata.yml beside submission_NNN/ folders: the
# student is then the submitter's email). Each submission is graded exactly as
# `./lab grade NN --submission` grades it (the sandbox, an unprivileged user when run as root), into
# OUT/<student>/results.json (what Gradescope would get) and OUT/<student>/state (how it ended).
# The class's result: OUT/gradebook.csv (student, lab, score, max, status, reason: an LMS imports
# it) and OUT/summary.md (a histogram and the commonest first failures per lab).
#
# Resumable: a rerun grades only the submissions not graded yet, changed since (their content's
# hash), or whose grading did not finish. A grading that did not finish (the job killed by
# Slurm: time limit, scancel, preemption, a node's failure; or this command interrupted) is
# recorded as not graded, with why, never as the student's 0.
cmd_grade_class() {
  local dir="" out="" labs=() jobs="" slurm=0 regrade=0 extra=() worker=0
  local partition="${SBATCH_PARTITION:-}" time_limit="${SBATCH_TIMELIMIT:-}" account="${SBATCH_ACCOUNT:-}"
  local gpus="" max_parallel=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --worker) worker=1 ;;
      --check) shift; class_check "$@"; return ;;
      --out) out=$2; shift ;;
      --jobs) jobs=$2; shift ;;
      --slurm) slurm=1 ;;
      --partition) partition=$2; shift ;;
      --time) time_limit=$2; shift ;;
      --account) account=$2; shift ;;
      --gpus) gpus=$2; shift ;;
      --max-parallel) max_parallel=$2; shift ;;
      --regrade) regrade=1 ;;
      --) shift; extra=("$@"); break ;;
      [0-9]|[0-9][0-9]) labs+=("$(norm "$1")") ;;
      -*) die "grade-class: unknown option '$1' (see ./lab help)" ;;
      *) [ -z "$dir" ] || die "grade-class: one folder of submissions only ('$dir', then '$1')"; dir=$1 ;;
    esac
    shift
  done
  if [ "$worker" = 1 ]; then class_grade_one "$dir" "${labs[@]}" -- "${extra[@]}"; return; fi
  [ -n "$dir" ] && [ -d "$dir" ] || die "grade-class: no folder of submissions${dir:+ at $dir} (./lab grade-class DIR NN ...)"
  [ ${#labs[@]} -gt 0 ] || die "grade-class: which lab(s)? (./lab grade-class DIR NN [NN ...])"
  dir=$(cd "$dir" && pwd)
  out=${out:-${dir%/}-graded}
  mkdir -p "$out"; out=$(cd "$out" && pwd)
  case "$out/" in "$dir/"*) die "grade-class: --out $out is inside the submissions folder" ;; esac

  # Everything shared is built once, before any grading starts: gradings running side by side
  # must never run two builds in one build directory.
  configure
  build dtl-grade dtl-sandbox >/dev/null
  export DTL_CLASS_PREBUILT="$BUILD"  # every ./lab below, here or in a Slurm task: build nothing here
  local rubric_list n; rubric_list=$(grader --source "$ROOT" --list)
  for n in "${labs[@]}"; do grep -q "^$n " <<<"$rubric_list" || die "grade-class: lab $n has no rubric"; done
  # The references' binaries too: each kind of node measures the references' own times once
  # (class_reference_times), from this build.
  local known t refs=()
  known=$(ninja -C "$BUILD" -t targets all 2>/dev/null | sed 's/:.*//')
  for n in "${labs[@]}"; do
    for t in "lab${n}_test_reference" "lab${n}_grade_reference" "lab${n}_bench_reference"; do
      grep -qx "$t" <<<"$known" && refs+=("$t")
    done
  done
  [ ${#refs[@]} -eq 0 ] || DTL_CLASS_PREBUILT='' build "${refs[@]}" >/dev/null

  local start=$SECONDS pending=() student
  while IFS= read -r student; do
    [ -n "$student" ] && pending+=("$student")
  done < <(class_intake "$dir" "$out" "$regrade" "${labs[*]}" "${extra[*]}")
  local total; total=$(find "$out" -mindepth 2 -maxdepth 2 -name submission -type d | wc -l)
  say "grade-class: $total submission(s) in $dir; ${#pending[@]} to grade (the rest graded already and unchanged)"
  if [ ${#pending[@]} -gt 0 ]; then
    if [ "$slurm" = 1 ]; then
      class_on_slurm "$out" "${labs[*]}" "$partition" "$time_limit" "$account" "$gpus" "$max_parallel" "${pending[@]}" -- "${extra[@]}"
    else
      class_locally "$out" "${labs[*]}" "${jobs:-$(( JOBS / 4 > 0 ? JOBS / 4 : 1 ))}" "${pending[@]}" -- "${extra[@]}"
    fi
  fi
  local rc=0
  "$BUILD/bin/dtl-grade" --gradebook "$out" --labs "${labs[@]}" --csv "$out/gradebook.csv" \
    --summary "$out/summary.md" || rc=$?
  say "grade-class: $(clock $((SECONDS - start))); gradebook $out/gradebook.csv$([ $rc -ne 0 ] && echo "; some not graded: run the same command again")"
  return $rc
}

# ./lab grade-class --check [--slurm]: the class check (grading/selftest/class_check.sh): a class of
# five for labs 01 and 03 graded locally and, with --slurm, through a one-node Slurm of this
# machine (root), each against the expected scores and each other. About 20 min locally and 20
# more with --slurm on 2 cores.
class_check() {
  [ -f "$ROOT/grading/selftest/class_check.sh" ] ||
    die "grade-class --check: the course's own repository has it (grading/selftest/class_check.sh)"
  bash "$ROOT/grading/selftest/class_check.sh" "$@"
}

# The submissions of DIR copied into OUT/<student>/submission; prints the students to grade.
# A student's key is the hash of their files, the labs and the grading options: a rerun grades
# those whose key changed or whose last grading did not end in "status=graded".
class_intake() {
  local dir=$1 out=$2 regrade=$3 lab_list=$4 opts=$5 entry student src key tmp
  local -A email=()
  if [ -f "$dir/submission_metadata.yml" ]; then
    # Gradescope's export: "submission_123:" then ":submitters:" with ":email: ..." entries.
    while read -r sub mail; do email[$sub]=$mail; done < <(awk '
      /^submission_[0-9]+:/ { sub(/:$/, "", $1); s = $1; next }
      s != "" && /:email:/ { print s, $NF; s = "" }' "$dir/submission_metadata.yml")
  fi
  for entry in "$dir"/*; do
    [ -d "$entry" ] || [[ "$entry" == *.zip ]] || continue
    student=$(basename "$entry" .zip)
    [ -n "${email[$student]:-}" ] && student=${email[$student]}
    student=${student//[^A-Za-z0-9@._+-]/_}
    mkdir -p "$out/$student"
    tmp="$out/$student/.incoming"
    rm -rf "$tmp"; mkdir -p "$tmp"
    if [ -d "$entry" ]; then
      # Regular files only: a link in a submission is never followed (the grader's intake
      # refuses them too).
      (cd "$entry" && find . -type f -print0 | tar --null -T - -cf -) | tar -C "$tmp" -xf -
    elif command -v python3 >/dev/null; then
      python3 -m zipfile -e "$entry" "$tmp" 2>/dev/null || { echo "status=not-graded" >"$out/$student/state"; echo "why=not a readable zip: $(basename "$entry")" >>"$out/$student/state"; continue; }
    else
      unzip -q -o "$entry" -d "$tmp" 2>/dev/null || { printf 'status=not-graded\nwhy=not a readable zip\n' >"$out/$student/state"; continue; }
    fi
    # A zip of one folder: its content is the submission.
    src=$tmp
    if [ "$(ls -A "$tmp" | wc -l)" = 1 ] && [ -d "$tmp/$(ls -A "$tmp")" ] && [ ! -f "$tmp/$(ls -A "$tmp")/lab" ]; then
      src="$tmp/$(ls -A "$tmp")"
    fi
    key=$( (cd "$src" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum; echo "$lab_list|$opts") | sha256sum | cut -c1-16)
    if [ "$regrade" = 0 ] && grep -qx "status=graded" "$out/$student/state" 2>/dev/null &&
       grep -qx "key=$key" "$out/$student/state"; then
      rm -rf "$tmp"; continue
    fi
    rm -rf "$out/$student/submission"; mv "$src" "$out/$student/submission"; rm -rf "$tmp"
    chmod -R a+rX "$out/$student/submission"  # read by the unprivileged grading user
    printf 'status=pending\nkey=%s\n' "$key" >"$out/$student/state"
    echo "$student"
  done
}

# One student: ./lab grade LABS --submission, then the state. Run by the local pool and by each
# Slurm array task (./lab grade-class --worker OUT/<student> LABS -- OPTIONS).
class_grade_one() {
  local d=$1 labs=() rc=0 key
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do labs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  key=$(grep '^key=' "$d/state" | head -1)
  printf 'status=running\n%s\njob=%s\nhost=%s\nstarted=%s\n' "$key" \
    "${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}" "$(hostname -s)" "$(date -Is)" >"$d/state"
  rm -f "$d/results.json" "$d/results.json.new"
  local times; times=$(class_reference_times "$(dirname "$d")" "${labs[@]}")
  DTL_CLASS_PREBUILT="$BUILD" class_in_scratch_slot "$ROOT/lab" grade "${labs[@]}" --submission "$d/submission" \
    --json "$d/results.json.new" --reference-times "$times" "$@" >"$d/log" 2>&1 || rc=$?
  if [ -s "$d/results.json.new" ]; then
    mv "$d/results.json.new" "$d/results.json"
    printf 'status=graded\n%s\nexit=%s\nfinished=%s\n' "$key" "$rc" "$(date -Is)" >"$d/state"
  else
    printf 'status=not-graded\n%s\nwhy=the grading stopped (exit %s) before writing its results: see %s\n' \
      "$key" "$rc" "$d/log" >"$d/state"
  fi
}

# class_in_scratch_slot COMMAND...: COMMAND with DTL_SCRATCH set to a scratch copy of the tree
# that no other grading holds (flock), one set of slots per host under BUILD/class-scratch/HOST
# (a node never shares a slot with another, even where the checkout is on a shared filesystem
# whose locks do not reach across nodes). A slot's build stays between gradings, of this class
# and of the next, so every grading after a slot's first recompiles only the student's files:
# minutes less per submission. The sources are copied anew every time (./lab grade
# --submission), so nothing of one student's files reaches the next, and a file that does not
# compile is graded as such, never with the last student's binary (the self-test's lanes grade
# `nocompile` after `correct` in one scratch build). Where locks do not work (flock missing or
# refused), each grading gets a fresh copy as before.
class_in_scratch_slot() {
  local base k fd rc=0
  base="$BUILD/class-scratch/$(hostname -s 2>/dev/null || echo node)"
  if command -v flock >/dev/null && mkdir -p "$base" 2>/dev/null; then
    for ((k = 0; k < 64; k++)); do
      exec {fd}>>"$base/slot-$k.lock" || break
      if flock -n "$fd"; then
        DTL_SCRATCH="$base/slot-$k" "$@" || rc=$?
        exec {fd}>&-
        return "$rc"
      fi
      exec {fd}>&-
    done
  fi
  "$@"
}

# The kind of node this runs on: its GPU model when it grades on GPUs, else its CPU model and
# core count. The references' times differ by kind, and a submission's time budget is a multiple
# of the reference's (grading/README.md), so each kind gets its own record.
class_node_kind() {
  local kind=""
  if [ "${DTL_DEVICE:-cpu}" = cuda ] && command -v nvidia-smi >/dev/null; then
    kind="gpu-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  fi
  [ "$kind" = gpu- ] || [ -z "$kind" ] &&
    kind="cpu-$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)-$(nproc)"
  printf '%s' "$kind" | tr -c 'A-Za-z0-9._+-' '_'
}

# The references' own times on this kind of node, measured once per class folder (the
# references graded, no performance checks) into OUT/.reference/<kind>.json; prints its path.
# Two gradings that start together on a new kind may both measure: the file is replaced whole.
class_reference_times() {
  local out=$1; shift
  local kind file tmp
  kind=$(class_node_kind); file="$out/.reference/$kind.json"
  if [ ! -s "$file" ]; then
    mkdir -p "$out/.reference"
    tmp=$(mktemp "$out/.reference/.$kind.XXXXXX")
    DTL_CLASS_PREBUILT="$BUILD" "$ROOT/lab" grade "$@" --solutions --no-perf --reference-times "$tmp" \
      --json "$tmp.results" >"$tmp.log" 2>&1 || true
    if [ -s "$tmp" ]; then mv "$tmp" "$file"; else rm -f "$tmp"; fi
    rm -f "$tmp.results" "$tmp.log"
  fi
  echo "$file"
}

# The local pool: JOBS gradings side by side (default: a quarter of the cores, each grading runs
# up to 4 ranks), each student's output in OUT/<student>/log.
class_locally() {
  local out=$1 lab_list=$2 jobs=$3; shift 3
  local students=() s k=0
  while [ $# -gt 0 ] && [ "$1" != -- ]; do students+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  say "grade-class: grading ${#students[@]} submission(s) here, $jobs at a time"
  for s in "${students[@]}"; do
    k=$((k + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    say "  [$k/${#students[@]}] $s"
    # shellcheck disable=SC2086
    class_grade_one "$out/$s" $lab_list -- "$@" &
  done
  wait || true
}

# Slurm: one array task per student (sbatch --array, --wait: slurm/grade-class.sbatch), then each
# task's end as Slurm saw it for the students whose grading did not finish.
class_on_slurm() {
  local out=$1 lab_list=$2 partition=$3 time_limit=$4 account=$5 gpus=$6 max_parallel=$7; shift 7
  local students=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do students+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  command -v sbatch >/dev/null || die "grade-class --slurm: no sbatch here (run it on the cluster's login node)"
  local run="$out/.slurm" list jobid i s
  mkdir -p "$run"; list="$run/students.$$"
  printf '%s\n' "${students[@]}" >"$list"
  # Each submission's job: the cores of the lab's largest world size (4 ranks), the grader's
  # worst case as its time (grading/README.md), GPUs when asked.
  local args=(--parsable --wait --array="0-$((${#students[@]} - 1))${max_parallel:+%$max_parallel}"
              --job-name=dtl-grade --ntasks=1 --cpus-per-task="${DTL_CLASS_CPUS:-4}"
              --output="$run/slurm-%A_%a.out" --time="${time_limit:-30}")
  [ -n "$partition" ] && args+=(--partition="$partition")
  [ -n "$account" ] && args+=(--account="$account")
  [ -n "$gpus" ] && args+=(--gpus="$gpus")
  # The task script is slurm/grade-class.sbatch, whose environment (slurm/env.sh) the GPU batch
  # scripts share; sbatch runs from the checkout, where the tasks start.
  local task=(slurm/grade-class.sbatch "$list" "$out")
  # shellcheck disable=SC2206
  task+=($lab_list -- "$@")
  say "grade-class: sbatch ${args[*]} ${task[*]} (${#students[@]} task(s))"
  jobid=$(cd "$ROOT" && sbatch "${args[@]}" "${task[@]}" 2>"$run/sbatch.err" | tail -1) || true
  jobid=${jobid%%;*}
  [ -n "$jobid" ] || { cat "$run/sbatch.err" >&2; die "grade-class: sbatch failed"; }
  echo "$jobid" >"$run/last-job"
  # --wait returns when every task ended, however it ended. A task that did not write
  # "status=graded" was killed or failed: ask Slurm how it ended.
  for i in "${!students[@]}"; do
    s=${students[$i]}
    grep -qx "status=graded" "$out/$s/state" 2>/dev/null && continue
    local how key
    how=$(slurm_job_state "${jobid}_$i" 2>/dev/null || true)
    key=$(grep '^key=' "$out/$s/state" | head -1)
    printf 'status=not-graded\n%s\nwhy=Slurm job %s_%s ended %s before the grading finished; graded again on the next run\n' \
      "$key" "$jobid" "$i" "${how:-without a result}" >"$out/$s/state"
  done
  rm -f "$list"
}
