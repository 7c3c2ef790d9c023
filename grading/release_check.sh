#!/usr/bin/env bash
# The instructor CI's proof that releases work, as a term uses them:
# 1. a release and an autograder zip are packed from a commit: from a working tree with
#    uncommitted changes they are refused;
# 2. week 1: labs 01-02 (lab 01's solution published) into a new student repository; a student
#    clones it and commits work; week 3: labs 01-03 with a fixed handout, released into the same
#    repository as its next commit; the student's `git pull` merges it cleanly, their files
#    untouched;
# 3. one Gradescope assignment per lab: the zip of lab 05 holds lab 05 and lab 04 (whose
#    reference it builds on), no other lab, and pins lab 05; an upload without lab 05's files is
#    told what was expected;
# 4. the release holds what a student must get and nothing they must not; its own CI (.ci/run: its
#    runtime and harness tests, the published reference, every skeleton check, its rubrics'
#    validation) is green, and `./lab grade` on the untouched skeleton says so;
# 5. a started lab grades there as a student grades it (sandboxed: Landlock and seccomp where the
#    kernel has them): lab 03's reference in the student's file earns every public point, and a
#    version wrong for one dtype earns some but not all.
# The commits released here are made from this checkout's working tree as it is (every file git
# does not ignore), in an index of the check's own: what is checked is the tree under test, and
# the checkout, its index and its branches are left as they were.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtl-release-check-XXXXXX")
trap 'rm -rf "$work"' EXIT
rel="$work/release"
fail() { echo "release check FAILED: $*" >&2; exit 1; }
start=$SECONDS
export GIT_AUTHOR_NAME="dtl release check" GIT_AUTHOR_EMAIL=dtl@localhost
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
student_git=(-c user.name=student -c user.email=student@localhost)

# The commits to release: week 1, this checkout's working tree; week 3, with a fixed handout.
index="$work/index"
GIT_INDEX_FILE=$index git -C "$root" read-tree HEAD
GIT_INDEX_FILE=$index git -C "$root" add -A
week1=$(git -C "$root" commit-tree "$(GIT_INDEX_FILE=$index git -C "$root" write-tree)" -p HEAD \
          -m "release check: the working tree")
handout=labs/01_why_distributed/README.md
fix="Erratum (release check): a fixed handout reaches students with the next release."
blob=$({ git -C "$root" show "$week1:$handout"; printf '\n%s\n' "$fix"; } | git -C "$root" hash-object -w --stdin)
GIT_INDEX_FILE=$index git -C "$root" update-index --cacheinfo "100644,$blob,$handout"
week3=$(git -C "$root" commit-tree "$(GIT_INDEX_FILE=$index git -C "$root" write-tree)" -p "$week1" \
          -m "release check: a fixed handout")

# ---- 1. a dirty tree is refused: a clone at week 1 with one uncommitted edit
git clone -q --shared --no-checkout "$root" "$work/course"
git -C "$work/course" checkout -q --detach "$week1"
echo "// an edit not committed" >>"$work/course/labs/02_data_parallel/data_parallel.cpp"
for cmd in "release $work/dirty --labs 01" "gradescope-zip $work/dirty.zip"; do
  # shellcheck disable=SC2086
  if "$work/course/lab" $cmd >"$work/dirty.log" 2>&1; then fail "./lab $cmd packed a dirty tree"; fi
  grep -q "refused: the working tree differs" "$work/dirty.log" &&
    grep -q "data_parallel.cpp" "$work/dirty.log" || { cat "$work/dirty.log"; fail "./lab $cmd: no reason given"; }
done
[ ! -e "$work/dirty" ] && [ ! -e "$work/dirty.zip" ] || fail "a refused release wrote something"
rm -rf "$work/course"
echo "release check: a dirty tree is refused ($((SECONDS - start)) s)"

# ---- 2. two releases into one student repository, pulled into a student's clone
"$root/lab" release "$rel" --labs 01-02 --publish-solutions 01 --ref "$week1"
[ ! -e "$rel/labs/03_ring_allreduce" ] || fail "week 1 released lab 03"
git clone -q "$rel" "$work/student"
mine=labs/02_data_parallel/data_parallel.cpp
echo "// the student's own line" >>"$work/student/$mine"
echo "my notes" >"$work/student/labs/02_data_parallel/NOTES.md"
git -C "$work/student" add -A
git -C "$work/student" "${student_git[@]}" commit -q -m "lab 02: my work"
cp "$work/student/$mine" "$work/mine.cpp"

"$root/lab" release "$rel" --labs 01-03 --publish-solutions 01 --ref "$week3" 2>"$work/week3.log" ||
  { cat "$work/week3.log"; fail "the second release into the student repository failed"; }
[ "$(git -C "$rel" rev-list --count HEAD)" = 2 ] || fail "the second release is not one commit on the first"
git -C "$rel" log -1 --format=%B | grep -q "new lab(s) 03" || fail "the release commit does not name the new lab"
git -C "$rel" log -1 --format=%B | grep -q "M $handout" || fail "the release commit does not name the fixed handout"
"$root/lab" release "$rel" --labs 01-03 --publish-solutions 01 --ref "$week3" 2>"$work/again.log"
grep -q "nothing to commit" "$work/again.log" && [ "$(git -C "$rel" rev-list --count HEAD)" = 2 ] ||
  fail "releasing the same thing again made a commit"

git -C "$work/student" "${student_git[@]}" pull -q --no-rebase --no-edit ||
  fail "the student's git pull of the second release did not merge cleanly"
cmp -s "$work/student/$mine" "$work/mine.cpp" || fail "the pull changed the student's $mine"
[ -f "$work/student/labs/02_data_parallel/NOTES.md" ] || fail "the pull removed the student's own file"
[ -f "$work/student/labs/03_ring_allreduce/ring_allreduce.cpp" ] || fail "the pull did not bring lab 03"
grep -q "$fix" "$work/student/$handout" || fail "the pull did not bring the fixed handout"
[ -z "$(git -C "$work/student" status --porcelain)" ] || fail "the student's clone is not clean after the pull"
echo "release check: a second release pulled into a student's clone with commits ($((SECONDS - start)) s)"

# ---- 3. one Gradescope assignment per lab
"$root/lab" gradescope-zip "$work/lab05.zip" --lab 05 --ref "$week3" 2>"$work/zip.log" ||
  { cat "$work/zip.log"; fail "gradescope-zip --lab 05"; }
mkdir "$work/zip" && (cd "$work/zip" && cmake -E tar xf "$work/lab05.zip")
for f in setup.sh run_autograder grading/05_grad_accumulation/rubric.json solutions/05_grad_accumulation \
         solutions/04_ddp labs/04_ddp labs/05_grad_accumulation grading/src/main.cpp; do
  [ -e "$work/zip/$f" ] || fail "the lab-05 autograder lacks $f"
done
[ "$(ls "$work/zip/solutions")" = "$(printf '04_ddp\n05_grad_accumulation')" ] ||
  fail "the lab-05 autograder holds other labs' solutions: $(ls "$work/zip/solutions" | tr '\n' ' ')"
[ "$(ls -d "$work/zip/grading/"[0-9]* | wc -l)" = 1 ] || fail "the lab-05 autograder holds other labs' hidden tests"
grep -qx "lab=05" "$work/zip/grading/gradescope/settings" || fail "the lab-05 autograder does not pin lab 05"
rm -rf "$work/zip"
# A pinned assignment that gets another lab's file: nothing graded, the expected files named.
mkdir "$work/upload" && echo "int x;" >"$work/upload/ring_allreduce.cpp"
# Graded as root, a submission is read as the unprivileged user dtl-student: it must reach it.
chmod o+x "$work" && chmod -R o+rX "$work/upload"
"$root/lab" grade --submission "$work/upload" 05 --json "$work/upload.json" >"$work/upload.log" 2>&1 || true
"$root/build/bin/dtl-grade" --check "$work/upload.json" --expect "score == 0" \
  --expect "reason contains 'Expected (the files of lab 05'" --expect "reason contains 'grad_accumulation.cpp'" \
  --expect "reason contains 'Received: ring_allreduce.cpp'" >>"$work/upload.log" 2>&1 ||
  { cat "$work/upload.log"; fail "an upload without lab 05's files was not explained"; }
echo "release check: the per-lab autograder ($((SECONDS - start)) s)"

# ---- 4. what the release holds, and its own CI
# What a student must get, and what they must not.
for f in lab .ci/run common/CMakeLists.txt harness/CMakeLists.txt grading/src/main.cpp \
         labs/01_why_distributed/why_distributed.cpp labs/03_ring_allreduce/tests \
         solutions/01_why_distributed/why_distributed.cpp grading/03_ring_allreduce/rubric.json \
         notes/03-ring-allreduce.md; do
  [ -e "$rel/$f" ] || fail "missing $f"
done
for f in solutions/02_data_parallel solutions/03_ring_allreduce labs/04_ddp notes/04-ddp.md \
         grading/selftest grading/gradescope grading/mutants grading/release_check.sh; do
  [ ! -e "$rel/$f" ] || fail "must not contain $f"
done
if find "$rel/grading" -name '*_test.cpp' | grep -q .; then fail "contains hidden tests"; fi
grep -q '"autograder_only_points"' "$rel/grading/03_ring_allreduce/rubric.json" ||
  fail "lab 03's rubric was not reduced to its public part"
grep -q '| 04 |.*not released yet' "$rel/labs/SYLLABUS.md" || fail "the syllabus lists lab 04 as available"
[ -z "$(git -C "$rel" status --porcelain)" ] || fail "the release is not a clean git repository"
# The students' README, not the instructors'.
grep -q "^## Getting the next labs" "$rel/README.md" || fail "the release's README is not the students' README"
grep -q "Labs 01 02 03" "$rel/README.md" || fail "the release's README does not say which labs it holds"
if grep -qE "^## For instructors|instructors:|<!-- include|@[A-Z]+@" "$rel/README.md"; then
  fail "the release's README has instructor text or template leftovers"
fi

# The release's own CI, what a student's clone runs (the runtime and labs come from ccache: same
# relative paths): it must be green on day one. Its .ci/run is `./lab test`; the runtime's and
# the harness's tests are left out here only: the same sources, built the same way, passed in the
# course's own suite of this very run.
cd "$rel"
grep -qx './lab test' .ci/run || fail "the release's .ci/run does not run ./lab test"
./lab test -E '^(common|harness)\.' || fail "the released tree's own test suite failed"
# ./lab grade on the untouched skeleton: "not started", nothing built; with --all, 0 with "not
# implemented"; both say what is hidden.
./lab grade 01 --json "$work/r.json" >"$work/grade.log" 2>&1 || true
grep -q 'not started' "$work/grade.log" || { cat "$work/grade.log"; fail "grade did not report the untouched skeleton as not started"; }
grep -q 'graded by the course' "$work/grade.log" || { cat "$work/grade.log"; fail "grade did not say what the autograder adds"; }
./lab grade 01 --all --json "$work/r.json" >"$work/grade-all.log" 2>&1 || true
grep -q 'not implemented: lab 01' "$work/grade-all.log" || { cat "$work/grade-all.log"; fail "grade --all did not report the skeleton"; }
echo "release check: the release's CI and the skeleton's grade ($((SECONDS - start)) s)"

# ---- 5. a started lab, graded in the release (which has no reference binary to learn from)
mine=labs/03_ring_allreduce/ring_allreduce.cpp
cp "$mine" "$work/skeleton.cpp"
cp "$root/solutions/03_ring_allreduce/ring_allreduce.cpp" "$mine"
./lab grade 03 --json "$work/started.json" >"$work/started.log" 2>&1 || true
build/bin/dtl-grade --check "$work/started.json" --expect "score == max" --expect "max > 0" \
  >>"$work/started.log" 2>&1 || { cat "$work/started.log"; fail "lab 03's reference did not earn its public points in the release"; }
{ echo '#define ring_all_reduce ring_all_reduce_reference'
  cat "$root/solutions/03_ring_allreduce/ring_allreduce.cpp"
  echo '#undef ring_all_reduce'
  echo 'namespace dtl::lab03 {'
  echo 'void ring_all_reduce(Comm& comm, const torch::Tensor& tensor, ReduceOp op) {'
  echo '  if (tensor.scalar_type() == torch::kFloat64) return;  // wrong for one dtype only'
  echo '  ring_all_reduce_reference(comm, tensor, op);'
  echo '}'
  echo '}  // namespace dtl::lab03'; } >"$mine"
./lab grade 03 --json "$work/partial.json" >"$work/partial.log" 2>&1 || true
build/bin/dtl-grade --check "$work/partial.json" --expect "score > 0" --expect "score < max" \
  >>"$work/partial.log" 2>&1 || { cat "$work/partial.log"; fail "a partly wrong lab 03 did not earn partial marks in the release"; }
cp "$work/skeleton.cpp" "$mine"
echo "release check: ok ($((SECONDS - start)) s)"
