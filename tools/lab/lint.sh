# Sourced by ./lab (which provides say, die, ROOT and the rest of its helpers; install_optional
# is tools/lab/site.sh's): ./lab lint, the linters CI runs on the tree's own scripts.

# Every shell script (./lab, the command files, the grader's and tests' scripts, the sbatch
# scripts, the Gradescope entry point) through shellcheck with .shellcheckrc's settings, and
# every Python file through pyflakes. Both are Debian packages, installed on first use.
cmd_lint() {
  install_optional "./lab lint" shellcheck pyflakes3
  local shell=() python=() f rc=0
  while IFS= read -r -d '' f; do
    case "$f" in
      *.py) python+=("$f") ;;
      *.sh|*.sbatch|lab|.ci/run|*/run_autograder) shell+=("$f") ;;
    esac
  done < <(git -C "$ROOT" ls-files -z --cached --others --exclude-standard)
  say "lint: shellcheck on ${#shell[@]} shell scripts, pyflakes on ${#python[@]} Python files"
  (cd "$ROOT" && shellcheck -s bash "${shell[@]}") || rc=1
  (cd "$ROOT" && pyflakes3 "${python[@]}") || rc=1
  [ "$rc" = 0 ] || die "lint: fix what is listed above"
  say "lint: clean"
}
