# Sourced by ./lab (which provides say, die, norm, lab_dir, ROOT, BUILD and the rest of its
# helpers): ./lab mutants, the grader judged by the wrong versions it must catch.
#
# grading/mutants/NN_slug/NAME.patch is a plausible wrong version of lab NN's reference: a
# unified diff against solutions/NN_slug (paths a/FILE and b/FILE, applied with patch -p1),
# preceded by free text whose first line says the mistake in one sentence. Each is graded the
# way ./lab grade --submission grades a student's upload (correctness only, --no-perf), beside
# the reference graded the same way; a mutant that keeps the reference's marks is a hole in the
# tests. The table says, per mutant, the points lost and the rubric groups that took them.

# mutant_list NN -> the lab's patch files, one per line (none: nothing printed)
mutant_list() {
  local slug; slug=$(lab_dir "$1")
  [ -d "$ROOT/grading/mutants/$slug" ] || return 0
  find "$ROOT/grading/mutants/$slug" -maxdepth 1 -name '*.patch' | sort
}

# mutant_apply NN PATCH DIR: DIR gets the lab's reference files with PATCH applied.
mutant_apply() {
  local slug; slug=$(lab_dir "$1")
  rm -rf "$3"; mkdir -p "$3"
  local f
  for f in "$ROOT/solutions/$slug"/*; do
    case "$f" in *.cpp|*.hpp|*.h) cp "$f" "$3/" ;; esac
  done
  patch -s -p1 -d "$3" --no-backup-if-mismatch <"$2" >&2
}

# mutant_unchanged NN DIR: every file in DIR equals the reference's (the patch changed nothing)
mutant_unchanged() {
  local f slug; slug=$(lab_dir "$1")
  for f in "$2"/*; do cmp -s "$f" "$ROOT/solutions/$slug/$(basename "$f")" || return 1; done
  return 0
}

cmd_mutants() {
  local labs=() check=0 names=() extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --check) check=1 ;;
      --test-timeout|--max-world) extra+=("$1" "$2"); shift ;;
      [0-9]|[0-9][0-9]) labs+=("$(norm "$1")") ;;
      *) names+=("$1") ;;
    esac
    shift
  done
  if [ ${#labs[@]} -eq 0 ]; then
    local d
    for d in "$ROOT"/grading/mutants/[0-9][0-9]_*/; do [ -d "$d" ] && labs+=("$(basename "$d" | cut -c1-2)"); done
  fi
  [ ${#labs[@]} -gt 0 ] || die "mutants: no grading/mutants/NN_slug/ yet"

  # --check: every patch still applies to today's reference and changes it, and every lab
  # listed has at least five (CI: seconds; what the grading itself costs is below).
  if [ "$check" = 1 ]; then
    local n p bad=0 count tmp; tmp=$(mktemp -d)
    for n in "${labs[@]}"; do
      count=0
      while IFS= read -r p; do
        [ -n "$p" ] || continue
        count=$((count + 1))
        if ! mutant_apply "$n" "$p" "$tmp/m" 2>"$tmp/err"; then
          printf 'lab %s: %s no longer applies to the reference: %s\n' "$n" "$(basename "$p")" "$(head -c 300 "$tmp/err")" >&2
          bad=1
        elif mutant_unchanged "$n" "$tmp/m"; then
          printf 'lab %s: %s changes nothing\n' "$n" "$(basename "$p")" >&2; bad=1
        fi
      done < <(mutant_list "$n")
      [ "$count" -ge 5 ] || { printf 'lab %s: %d mutants (at least 5 wanted)\n' "$n" "$count" >&2; bad=1; }
      printf 'lab %s: %d mutants apply\n' "$n" "$count"
    done
    rm -rf "$tmp"
    return "$bad"
  fi

  local out="$BUILD/mutants" n p name sub json missed=0 summary
  mkdir -p "$out"
  summary="$out/summary.md"
  : >"$summary"
  for n in "${labs[@]}"; do
    local slug; slug=$(lab_dir "$n")
    local patches=()
    while IFS= read -r p; do
      [ -n "$p" ] || continue
      name=$(basename "$p" .patch)
      if [ ${#names[@]} -gt 0 ] && [[ " ${names[*]} " != *" $name "* ]]; then continue; fi
      patches+=("$p")
    done < <(mutant_list "$n")
    [ ${#patches[@]} -gt 0 ] || { say "lab $n: no mutants${names:+ named ${names[*]}}"; continue; }
    # One scratch tree per lab, kept: each mutant then recompiles only the lab's files.
    local scratch="$out/scratch-$n"
    sub="$out/$n/reference"; json="$out/$n/reference.json"
    mkdir -p "$sub"; cp "$ROOT/solutions/$slug"/*.cpp "$sub/" 2>/dev/null || true
    cp "$ROOT/solutions/$slug"/*.hpp "$sub/" 2>/dev/null || true
    chmod -R a+rX "$out/$n"
    say "lab $n: the reference, graded as a submission"
    rm -f "$json"
    DTL_SCRATCH="$scratch" "$ROOT/lab" grade "$n" --submission "$sub" --json "$json" --no-perf \
      "${extra[@]}" >"$out/$n/reference.log" 2>&1 || true
    local ref_score
    ref_score=$(mutant_score "$json") || die "mutants: the reference of lab $n was not graded (see $out/$n/reference.log)"
    {
      printf '\n## Lab %s: %d mutants; the reference scores %s\n\n' "$n" "${#patches[@]}" "$ref_score"
      printf '| mutant | the mistake | score | caught by |\n| --- | --- | ---: | --- |\n'
    } >>"$summary"
    for p in "${patches[@]}"; do
      name=$(basename "$p" .patch)
      sub="$out/$n/$name"; json="$out/$n/$name.json"
      mutant_apply "$n" "$p" "$sub" || die "mutants: $p does not apply to the reference (./lab mutants $n --check)"
      chmod -R a+rX "$out/$n"
      say "lab $n: $name"
      rm -f "$json"
      DTL_SCRATCH="$scratch" "$ROOT/lab" grade "$n" --submission "$sub" --json "$json" --no-perf \
        "${extra[@]}" >"$out/$n/$name.log" 2>&1 || true
      local score caught
      score=$(mutant_score "$json") || score="not graded"
      caught=$(mutant_caught "$json" "$ref_score")
      if [ ! -f "$json" ]; then
        caught="NOT GRADED: the grading did not finish (see $out/$n/$name.log)"; missed=$((missed + 1))
      elif [ -z "$caught" ]; then
        caught="NOTHING: keeps the reference's marks"; missed=$((missed + 1))
      fi
      printf '    %-28s %-10s %s\n' "$name" "$score" "$caught"
      printf '| `%s` | %s | %s | %s |\n' "$name" "$(sed -n '1p' "$p")" "$score" "$caught" >>"$summary"
    done
  done
  say "summary: $summary"
  [ "$missed" -eq 0 ] || die "mutants: $missed mutant(s) keep the reference's marks or were not graded"
}

# mutant_score JSON -> "S/M" of the correctness points (fails when there is no results file)
mutant_score() {
  [ -f "$1" ] || return 1
  python3 - "$1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
tests = [t for t in d.get("tests", []) if "max_score" in t]
print(f"{sum(t.get('score', 0) for t in tests):.1f}/{sum(t['max_score'] for t in tests):.1f}")
EOF
}

# mutant_caught JSON REF_SCORE -> the rubric groups that lost points, with the points
# (empty when the mutant scores what the reference scores)
mutant_caught() {
  [ -f "$1" ] || return 0
  python3 - "$1" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
ref = float(sys.argv[2].split("/")[0])
tests = [t for t in d.get("tests", []) if "max_score" in t]
score = sum(t.get("score", 0) for t in tests)
if score >= ref - 1e-9:
    sys.exit(0)
lost = [t for t in tests if t.get("score", 0) < t["max_score"] - 1e-9]
parts = []
for t in lost:
    name = t["name"].split("|", 1)[-1].strip()
    parts.append(f"{name} (-{t['max_score'] - t.get('score', 0):.1f})")
print(f"-{ref - score:.1f}: " + "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else ""))
EOF
}
