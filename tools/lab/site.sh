# Sourced by ./lab (which provides say, die, clock, build, configure, mpi_env, ROOT, BUILD and the
# rest of its helpers): ./lab figures and ./lab site, and the optional packages they install.

# ---------------------------------------------------------------- figures and the website

# python_with MODULE...: the first of $DTL_PYTHON, python3, /usr/bin/python3 that imports every
# MODULE (Debian's packages install into /usr/bin/python3's path, which another python3 first in
# PATH, e.g. pyenv's, does not see).
python_with() {
  local c mods
  mods=$(IFS=,; echo "$*")
  for c in ${DTL_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c "import $mods" 2>/dev/null; then echo "$c"; return 0; fi
  done
  return 1
}

# install_optional WHAT PKG...: Debian packages that one command needs and the rest of dtl does
# not (as bench peers needs python3-torch): installed on first use as root or with sudo,
# otherwise the exact apt-get line to run.
install_optional() {
  local what=$1; shift
  local missing=() sudo=()
  command -v dpkg-query >/dev/null ||
    die "$what needs the Debian packages $* (or their equivalents; DTL_PYTHON may name a python3 that has them)"
  read -ra missing <<<"$(missing_packages "$@")"
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    sudo -n true 2>/dev/null ||
      die "$what needs: apt-get install -y --no-install-recommends ${missing[*]} (as root)"
    sudo=(sudo)
  fi
  say "$what: installing ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# ./lab figures: each lab's demo writes its data (--json/--trace), tools/figures/ draws it; the
# recipes (which run makes which figure) are in tools/figures/make_figures.py.
cmd_figures() {
  local labs=() side=reference out="" trace="" opts=() check=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --student) side=student ;;
      --solutions|--reference) side=reference ;;
      --out) out=$2; shift ;;
      --trace) trace=$2; shift ;;
      --runs|--max-load|--wait-load)
        [ $# -ge 2 ] || die "figures: $1 needs a value"
        opts+=("$1" "$2"); shift ;;
      --allow-load|--draw-only) opts+=("$1") ;;
      --check-quoted) check=1 ;;
      [0-9]|[0-9][0-9]) labs+=("$(norm "$1")") ;;
      *) die "figures: unknown argument '$1' (see ./lab help)" ;;
    esac
    shift
  done
  local py
  py=$(python_with matplotlib) || {
    install_optional "./lab figures" python3-matplotlib
    py=$(python_with matplotlib) || die "figures: no python3 imports matplotlib (set DTL_PYTHON)"
  }
  if [ -n "$trace" ]; then
    [ -f "$trace" ] || die "figures: no trace file $trace"
    [ -n "$out" ] || out="${trace%.json}.svg"
    "$py" "$ROOT/tools/figures/timeline.py" trace "$trace" "$out"
    say "wrote $out"
    return
  fi
  if [ "$check" = 1 ]; then  # the notes' quoted numbers against the committed figures: no runs
    "$py" "$ROOT/tools/figures/make_figures.py" --check-quoted --root "$ROOT"
    return
  fi
  if [ "$side" = reference ]; then
    [ -d "$ROOT/solutions" ] ||
      die "figures: this checkout has no reference solutions; ./lab figures NN --student draws yours"
    [ -n "$out" ] || out="$ROOT/notes/figures"
  else
    [ -n "$out" ] || out="$BUILD/figures"
  fi
  local list targets=()
  list=$(IFS=,; echo "${labs[*]:-}")
  read -r -a targets <<<"$("$py" "$ROOT/tools/figures/make_figures.py" --targets --side "$side" --labs "$list")"
  [ ${#targets[@]} -gt 0 ] || exit 1
  # --draw-only draws from the data of earlier runs: nothing to build
  case " ${opts[*]:-} " in *" --draw-only "*) ;; *) build "${targets[@]}" ;; esac
  mpi_env
  say "figures: running the ${side} demos and drawing (tools/figures/)"
  local start=$SECONDS
  "$py" "$ROOT/tools/figures/make_figures.py" --bin "$BUILD/bin" --out "$out" \
    --data "$BUILD/figures-data" --side "$side" --labs "$list" --mpirun "${MPIRUN[*]}" \
    "${opts[@]}"
  say "figures: $((SECONDS - start)) s of runs and drawing, into $out"
}

# ./lab site: the course website from the repository's Markdown (tools/site/build_site.py), and
# with --test its check in a real browser (tools/site/test_site.py).
cmd_site() {
  local test=0 out="$BUILD/site"
  while [ $# -gt 0 ]; do
    case "$1" in
      --test) test=1 ;;
      --out) out=$2; shift ;;
      *) die "site: unknown argument '$1' (see ./lab help)" ;;
    esac
    shift
  done
  case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
  local pkgs=(mkdocs mkdocs-material) mods=(mkdocs)
  [ "$test" = 1 ] && { pkgs+=(chromium chromium-driver python3-selenium python3-pil); mods+=(selenium PIL); }
  local py
  py=$(python_with "${mods[@]}") || {
    install_optional "./lab site" "${pkgs[@]}"
    py=$(python_with "${mods[@]}") || die "site: no python3 imports ${mods[*]} (set DTL_PYTHON)"
  }
  [ "$test" = 1 ] && { command -v chromium >/dev/null && command -v chromedriver >/dev/null ||
    install_optional "./lab site --test" chromium chromium-driver; }
  local start=$SECONDS
  "$py" "$ROOT/tools/site/build_site.py" --root "$ROOT" --stage "$BUILD/site-src" --out "$out"
  say "site: built in $((SECONDS - start)) s: open $out/index.html, or publish the directory (README: For instructors)"
  if [ "$test" = 1 ]; then
    start=$SECONDS
    "$py" "$ROOT/tools/site/test_site.py" --site "$out" --shots "$BUILD/site-test"
    say "site: browser test passed in $((SECONDS - start)) s (screenshots: $BUILD/site-test)"
  fi
}
