# Sourced by ./lab (which provides say, die, build, ROOT, BUILD and the rest of its helpers; and
# install_optional, tools/lab/site.sh's): ./lab release and ./lab gradescope-zip. The logic (which
# files a release holds, the students' repository, the commit message, the per-lab autograder) is
# tools/lab/release.py's; this file installs Python where it is missing and builds the grader.

release_py() {
  command -v python3 >/dev/null || install_optional "./lab $1" python3
  python3 "$ROOT/tools/lab/release.py" "$@"
}

# A student release (README "For instructors"): refused before anything is built when the
# arguments, the commit or the destination are wrong; the grader writes each lab's public rubric.
cmd_release() {
  release_py release --check-only "$@" || exit 1
  build dtl-grade >/dev/null
  release_py release --grader "$BUILD/bin/dtl-grade" "$@"
}

# The Gradescope autograder zip (grading/README.md, "Gradescope").
cmd_gradescope_zip() { release_py gradescope-zip "$@"; }
