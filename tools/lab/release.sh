# Sourced by ./lab (which provides say, die, clock, configure, build, norm, grader, mpi_env, ROOT,
# BUILD and the rest of its helpers): ./lab release and gradescope-zip, and the helpers that pack a commit.

# ---------------------------------------------------------------- course operations

# expand_labs "01-03,05" -> "01 02 03 05"
expand_labs() {
  local part a b k found=() parts=()
  IFS=',' read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    part=${part// /}
    if [[ "$part" =~ ^([0-9]+)-([0-9]+)$ ]]; then
      a=$((10#${BASH_REMATCH[1]})); b=$((10#${BASH_REMATCH[2]}))
      for ((k = a; k <= b; k++)); do found+=("$(printf '%02d' "$k")"); done
    elif [[ "$part" =~ ^[0-9]+$ ]]; then
      found+=("$(norm "$part")")
    elif [ -n "$part" ]; then
      die "not a lab list: '$1' (e.g. 01-07 or 01,03,05)"
    fi
  done
  echo "${found[@]:-}"
}

# lab_deps TREE NN: the labs whose reference lab NN builds on (DEPENDS dtl_labMM_reference in
# TREE/labs/NN_slug/CMakeLists.txt).
lab_deps() {
  local d
  d=$(ls -d "$1"/labs/"$2"_*/ 2>/dev/null | head -1)
  [ -n "$d" ] || return 0
  grep -o 'dtl_lab[0-9][0-9]_reference' "$d/CMakeLists.txt" 2>/dev/null |
    sed 's/dtl_lab\([0-9][0-9]\)_reference/\1/' | sort -u
}

# lab_closure TREE NN: lab NN and every lab whose reference it builds on, directly or not.
lab_closure() {
  local tree=$1 todo=("$2") seen=() n m
  while [ ${#todo[@]} -gt 0 ]; do
    n=${todo[0]}; todo=("${todo[@]:1}")
    [[ " ${seen[*]} " == *" $n "* ]] && continue
    seen+=("$n")
    for m in $(lab_deps "$tree" "$n"); do todo+=("$m"); done
  done
  printf '%s\n' "${seen[@]}" | sort
}

# Releases and autograders are packed from a commit (HEAD, or --ref REF), never from the working
# tree: an edit not yet committed (a solution pasted into a skeleton while trying it) must not
# reach students. course_commit WHAT REF ALLOW_DIRTY prints the commit's hash; packing HEAD from a
# tree with uncommitted changes or untracked files is refused unless ALLOW_DIRTY is 1.
course_commit() {
  local what=$1 ref=$2 allow=$3 commit dirty
  { command -v git >/dev/null && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; } ||
    die "$what: needs the course repository as a git checkout (it packs a commit)"
  commit=$(git -C "$ROOT" rev-parse --verify -q "$ref^{commit}") || die "$what: no commit '$ref'"
  if [ "$allow" = 0 ] && [ "$commit" = "$(git -C "$ROOT" rev-parse HEAD)" ]; then
    dirty=$(git -C "$ROOT" status --porcelain)
    [ -z "$dirty" ] || die "$what: refused: the working tree differs from $ref (${commit:0:12}), and $what packs the commit, not the working tree:
$(head -n 12 <<<"$dirty")$([ "$(wc -l <<<"$dirty")" -gt 12 ] && printf '\n...')
Commit (or stash) what belongs in it, or pass --allow-dirty to pack ${commit:0:12} as committed."
  fi
  echo "$commit"
}

# export_commit COMMIT DIR: the files of COMMIT, as committed, into DIR.
export_commit() {
  mkdir -p "$2"
  git -C "$ROOT" archive --format=tar "$1" | tar -C "$2" -xf -
}

describe_commit() { git -C "$ROOT" log -1 --format='%h (%cs, "%s")' "$1"; }

# readme_section FILE HEADING: the section of a Markdown file that starts at the line HEADING and
# ends before the next heading of the same or a higher level (a level-1 heading: before the first
# section), code fences skipped over, table rows for instructors ("| ... instructors: ...") left out.
readme_section() {
  awk -v h="$2" '
    /^```/ { fence = !fence }
    !fence && /^#+ / {
      lvl = index($0, " ") - 1
      if (on && lvl <= (level < 2 ? 2 : level)) exit
      if ($0 == h) { on = 1; level = lvl }
    }
    on && !(/^\|/ && /instructors:/) { print }
    END { if (!on) exit 1 }' "$1"
}

# student_readme TREE LABS SOLUTIONS UPSTREAM: the README of a student release, from the template
# tools/release/student_README.md: its "<!-- include: HEADING -->" lines take those sections of
# the course's README.md (one text for both, so they never drift apart); @LABS@, @SOLUTIONS@ and
# @UPSTREAM@ say what this release holds and where students pull it from. The template's own
# leading comment is dropped.
student_readme() {
  local tree=$1 labs=$2 sols=$3 upstream=$4 line head=1 heading
  local template="$tree/tools/release/student_README.md"
  [ -f "$template" ] || die "release: the commit has no $template"
  while IFS= read -r line; do
    if [ "$head" = 1 ]; then
      if [[ "$line" == "<!--"* ]]; then head=2; else head=0; fi
    fi
    if [ "$head" = 2 ]; then
      [[ "$line" == *"-->" ]] && head=0
      continue
    fi
    if [[ "$line" =~ ^\<\!--\ include:\ (.*)\ --\>$ ]]; then
      heading=${BASH_REMATCH[1]}
      readme_section "$tree/README.md" "$heading" ||
        die "release: the student README template includes the section '$heading', which README.md does not have"
      continue
    fi
    line=${line//@LABS@/$labs}
    line=${line//@SOLUTIONS@/$sols}
    line=${line//@UPSTREAM@/$upstream}
    printf '%s\n' "$line"
  done <"$template"
}

# A student release: the runtime, tools, handouts, notes and public tests of the chosen labs; no
# solutions (but the published ones), no hidden tests, no grader self-test or Gradescope kit.
# Into an empty DIR it writes a new git repository; into DIR that is the students' repository
# (a clone of an earlier release) it commits the new state on top of its history, so students
# `git pull` it into their own work (README "For instructors", the student README).
cmd_release() {
  local dir="" labs_spec="" pub_spec="" ref=HEAD allow_dirty=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --labs) labs_spec=$2; shift ;;
      --publish-solutions) pub_spec=$2; shift ;;
      --ref) ref=$2; shift ;;
      --allow-dirty) allow_dirty=1 ;;
      -*) die "release: unknown option '$1' (see ./lab help)" ;;
      *) [ -z "$dir" ] || die "release: one directory only"; dir=$1 ;;
    esac
    shift
  done
  [ -n "$dir" ] || die "release: where to? (./lab release DIR [--labs 01-07] [--publish-solutions 01-03] [--ref REF])"
  local commit; commit=$(course_commit release "$ref" "$allow_dirty") || exit 1
  local stage; stage=$(mktemp -d "${TMPDIR:-/tmp}/dtl-release-XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$stage'" EXIT
  local tree="$stage/course" out="$stage/release"
  export_commit "$commit" "$tree"
  local all=() labs=() pub=() n m d
  for d in "$tree"/labs/[0-9][0-9]_*/; do [ -d "$d" ] && all+=("$(basename "$d" | cut -c1-2)"); done
  if [ -n "$labs_spec" ]; then read -ra labs <<<"$(expand_labs "$labs_spec")"; else labs=("${all[@]}"); fi
  read -ra pub <<<"$(expand_labs "$pub_spec")"
  for n in "${labs[@]}"; do
    [[ " ${all[*]} " == *" $n "* ]] || die "release: commit ${commit:0:12} has no lab $n (labs: ${all[*]})"
  done
  for n in "${pub[@]}"; do
    [[ " ${labs[*]} " == *" $n "* ]] || die "release: --publish-solutions $n, but lab $n is not released (--labs)"
  done
  # A lab built on an earlier lab's reference needs that reference's source: publish it (the
  # usual week-by-week order: lab 05 is released after lab 04's deadline).
  for n in "${labs[@]}"; do
    for m in $(lab_deps "$tree" "$n"); do
      [[ " ${labs[*]} " == *" $m "* && " ${pub[*]} " == *" $m "* ]] ||
        die "release: lab $n builds on lab $m's reference solution: release lab $m and publish its solution (--publish-solutions $m), or leave lab $n out"
    done
  done
  # Where it goes: a new repository, or the next commit of the students' repository.
  local mode=new old_labs=() old_pub=() upstream="<URL-of-this-repository>"
  if [ -e "$dir" ] && [ "$(ls -A "$dir" 2>/dev/null)" = .git ] &&
     ! git -C "$dir" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    mode=empty-clone  # a clone of the students' repository, made empty on the forge
  elif [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    [ "$(git -C "$dir" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$dir" && pwd -P)" ] &&
      [ -f "$dir/lab" ] && [ -f "$dir/labs/SYLLABUS.md" ] ||
      die "release: $dir is neither empty nor a student repository (a clone of an earlier release)"
    [ -z "$(git -C "$dir" status --porcelain)" ] ||
      die "release: $dir has uncommitted changes; commit or discard them first (a release replaces its files and commits)"
    for d in "$dir"/labs/[0-9][0-9]_*/; do [ -d "$d" ] && old_labs+=("$(basename "$d" | cut -c1-2)"); done
    for d in "$dir"/solutions/[0-9][0-9]_*/; do [ -d "$d" ] && old_pub+=("$(basename "$d" | cut -c1-2)"); done
    # Students have work in every lab they got: a release never takes a lab back.
    for n in "${old_labs[@]}"; do
      [[ " ${labs[*]} " == *" $n "* ]] ||
        die "release: lab $n is in $dir already and not in --labs: students would lose it on their next pull; release it again"
    done
    mode=update
  fi
  build dtl-grade >/dev/null
  # The files: the commit's, filtered.
  local files=() f k keep
  while IFS= read -r -d '' f; do
    keep=1
    case "$f" in
      labs/[0-9][0-9]_*) k=${f:5:2}; [[ " ${labs[*]} " == *" $k "* ]] || keep=0 ;;
      solutions/[0-9][0-9]_*) k=${f:10:2}; [[ " ${pub[*]} " == *" $k "* ]] || keep=0 ;;
      solutions/*) keep=0 ;;
      grading/[0-9][0-9]_*/rubric.json) k=${f:8:2}; [[ " ${labs[*]} " == *" $k "* ]] || keep=0 ;;
      grading/[0-9][0-9]_*|grading/selftest/*|grading/gradescope/*|grading/mutants/*|grading/release_check.sh) keep=0 ;;
      notes/[0-9][0-9]-*) k=${f:6:2}; [[ " ${labs[*]} " == *" $k "* ]] || keep=0 ;;
      tools/release/*) keep=0 ;;
    esac
    [ "$keep" = 1 ] && files+=("$f")
  done < <(git -C "$ROOT" ls-tree -r -z --name-only "$commit")
  mkdir -p "$out"
  printf '%s\0' "${files[@]}" | tar -C "$tree" --null -T - -cf - | tar -C "$out" -xf -
  for n in "${labs[@]}"; do
    local slug; slug=$(basename "$(ls -d "$tree"/labs/"$n"_*/)")
    "$BUILD/bin/dtl-grade" --public-rubric "$tree/grading/$slug/rubric.json" >"$out/grading/$slug/rubric.json"
  done
  # The syllabus still lists every lecture; labs not in this release say so, without links to
  # the handout and note the release does not have.
  for n in "${all[@]}"; do
    [[ " ${labs[*]} " == *" $n "* ]] ||
      sed -i -E -e "/^\| $n \|/s/\[([^]]*)\]\([^)]*\)/\1/g" \
        -e "s/^(\| $n \|.*\| )available \|$/\1not released yet |/" "$out/labs/SYLLABUS.md"
  done
  local sols=""
  [ ${#pub[@]} -gt 0 ] && sols="; the reference solutions of labs ${pub[*]} are in \`solutions/\`"
  # Where students pull from: the students' repository's own remote, when it has one.
  [ "$mode" != new ] && upstream=$(git -C "$dir" remote get-url origin 2>/dev/null || echo "$upstream")
  student_readme "$tree" "${labs[*]}" "$sols" "$upstream" >"$out/README.md"
  # Into the repository.
  local git_id=()
  case "$mode" in
    new) mkdir -p "$dir"; git -C "$dir" init -q -b main ;;
    update) git -C "$dir" rm -rq . ;;
  esac
  [ -n "$(git -C "$dir" config user.email)" ] || git_id=(-c user.name=dtl -c user.email=dtl@localhost)
  tar -C "$out" -cf - . | tar -C "$dir" -xf -
  git -C "$dir" add -A
  if [ "$mode" = update ] && git -C "$dir" diff --cached --quiet; then
    say "release: $dir already holds exactly this release (labs ${labs[*]}; commit ${commit:0:12}): nothing to commit"
    return 0
  fi
  # The commit says what changed: new labs, newly published solutions, updated files.
  local new_labs=() new_pub=() changed=() line path
  if [ "$mode" = update ]; then
    for n in "${labs[@]}"; do [[ " ${old_labs[*]} " == *" $n "* ]] || new_labs+=("$n"); done
    for n in "${pub[@]}"; do [[ " ${old_pub[*]} " == *" $n "* ]] || new_pub+=("$n"); done
    while IFS= read -r line; do
      path=${line#*$'\t'}
      case "$path" in
        labs/[0-9][0-9]_*) [[ " ${new_labs[*]} " == *" ${path:5:2} "* ]] && continue ;;
        grading/[0-9][0-9]_*) [[ " ${new_labs[*]} " == *" ${path:8:2} "* ]] && continue ;;
        notes/[0-9][0-9]-*) [[ " ${new_labs[*]} " == *" ${path:6:2} "* ]] && continue ;;
        solutions/[0-9][0-9]_*) [[ " ${new_pub[*]} " == *" ${path:10:2} "* ]] && continue ;;
      esac
      changed+=("  ${line%%$'\t'*} $path")
    done < <(git -C "$dir" diff --cached --name-status --no-renames)
  fi
  local subject body
  if [ "$mode" != update ]; then
    subject="dtl student release: labs ${labs[*]}${pub[*]:+, solutions ${pub[*]}}"
  else
    subject="dtl release:${new_labs[*]:+ new lab(s) ${new_labs[*]};}${new_pub[*]:+ solution(s) of ${new_pub[*]};}${changed[*]:+ ${#changed[@]} file(s) updated;}"
    subject=${subject%;}
  fi
  body="Labs: ${labs[*]}${new_labs[*]:+ (new: ${new_labs[*]})}"
  [ ${#pub[@]} -gt 0 ] && body+=$'\n'"Reference solutions: ${pub[*]}${new_pub[*]:+ (new: ${new_pub[*]})}"
  if [ ${#changed[@]} -gt 0 ]; then
    body+=$'\n\n'"Updated since the last release (M changed, A added, D removed):"
    body+=$'\n'"$(printf '%s\n' "${changed[@]:0:40}")"
    [ ${#changed[@]} -gt 40 ] && body+=$'\n'"  ... and $((${#changed[@]} - 40)) more"
  fi
  [ "$mode" = update ] && body+=$'\n\n'"Students: git pull (README.md, \"Getting the next labs\")."
  body+=$'\n\n'"Course-commit: $commit"
  git -C "$dir" "${git_id[@]}" commit -q -m "$subject" -m "$body"
  if [ "$mode" = update ]; then say "release: the next commit of the student repository $dir"; else say "release: the first commit of the student repository $dir"; fi
  printf '  labs:      %s%s\n' "${labs[*]}" "${new_labs[*]:+ (new: ${new_labs[*]})}" >&2
  printf '  solutions: %s%s\n' "${pub[*]:-none}" "${new_pub[*]:+ (new: ${new_pub[*]})}" >&2
  [ "$mode" = update ] && printf '  updated:   %d file(s) besides the new labs (git -C %s show --stat)\n' "${#changed[@]}" "$dir" >&2
  printf '  from:      course commit %s\n' "$(describe_commit "$commit")" >&2
  printf '  commit:    %s on %s (%d files); publish it: git -C %s push\n' \
    "$(git -C "$dir" rev-parse --short HEAD)" "$(git -C "$dir" branch --show-current)" \
    "$(git -C "$dir" ls-files | wc -l)" "$dir" >&2
}

# The Gradescope autograder: a commit of this repository plus setup.sh and run_autograder at the
# zip's root, where Gradescope looks for them. With --lab NN, the autograder of one assignment:
# lab NN's handout, tests, hidden tests and reference, and the labs whose references it builds
# on (the trusted driver runs the reference's build of the tests), nothing of any other lab; the
# lab is pinned in grading/gradescope/settings, which run_autograder reads.
cmd_gradescope_zip() {
  local out="" lab="" ref=HEAD allow_dirty=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --lab) lab=$(norm "$2"); shift ;;
      --ref) ref=$2; shift ;;
      --allow-dirty) allow_dirty=1 ;;
      -*) die "gradescope-zip: unknown option '$1' (see ./lab help)" ;;
      *) [ -z "$out" ] || die "gradescope-zip: one output file only"; out=$1 ;;
    esac
    shift
  done
  [ -n "$out" ] || out="$ROOT/dtl-autograder${lab:+-lab$lab}.zip"
  case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
  local commit; commit=$(course_commit gradescope-zip "$ref" "$allow_dirty") || exit 1
  local stage; stage=$(mktemp -d "${TMPDIR:-/tmp}/dtl-autograder-XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$stage'" EXIT
  export_commit "$commit" "$stage"
  local what="every lab, chosen by the submission's file names" d k
  if [ -n "$lab" ]; then
    ls -d "$stage"/grading/"$lab"_*/rubric.json >/dev/null 2>&1 ||
      die "gradescope-zip: lab $lab has no rubric (grading/${lab}_*/rubric.json) in ${commit:0:12}"
    local keep; keep=" $(lab_closure "$stage" "$lab" | tr '\n' ' ')"
    for d in "$stage"/labs/[0-9][0-9]_* "$stage"/solutions/[0-9][0-9]_* "$stage"/notes/[0-9][0-9]-*; do
      k=$(basename "$d" | cut -c1-2)
      [[ "$keep" == *" $k "* ]] || rm -rf "$d"
    done
    for d in "$stage"/grading/[0-9][0-9]_*; do
      [ "$(basename "$d" | cut -c1-2)" = "$lab" ] || rm -rf "$d"
    done
    printf '# Written by ./lab gradescope-zip --lab %s: the lab this autograder grades.\nlab=%s\n' \
      "$lab" "$lab" >"$stage/grading/gradescope/settings"
    local deps=()
    for k in $keep; do [ "$k" = "$lab" ] || deps+=("$k"); done
    what="lab $lab${deps[*]:+, with the reference solutions of lab(s) ${deps[*]}, which it builds on}"
  fi
  rm -rf "$stage/grading/mutants"  # the instructors' wrong versions: no part of grading
  cp "$stage/grading/gradescope/setup.sh" "$stage/grading/gradescope/run_autograder" "$stage/"
  rm -f "$out"
  (cd "$stage" && find . -mindepth 1 -maxdepth 1 -printf '%P\0' | xargs -0 cmake -E tar cf "$out" --format=zip --)
  say "wrote $out"
  printf '  grades:    %s\n' "$what" >&2
  printf '  from:      course commit %s\n' "$(describe_commit "$commit")" >&2
  local assignment="an assignment that takes any lab"
  [ -n "$lab" ] && assignment="lab $lab's assignment"
  printf '  upload it as the autograder of %s (base image: Debian 12 or Ubuntu 24.04; grading/README.md, "Gradescope")\n' \
    "$assignment" >&2
}
