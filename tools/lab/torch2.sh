# Sourced by ./lab (which provides say, die, clock, build, configure, mpi_env, ROOT, BUILD and the
# rest of its helpers): ./lab torch2 and the Debian roots it and gpu-build share.

# ---------------------------------------------------------------- LibTorch 2.x (Debian 13 root)

# ./lab torch2 [COMMAND ARGS...] (./lab test --torch2 is `./lab torch2 test`): any ./lab command
# inside a Debian 13 (trixie) root under build-torch2/, whose libtorch-dev is LibTorch 2.6, with
# g++ 14, OpenMPI 5, fmt 10, GoogleTest 1.16. GPU users build against a LibTorch 2.x (pip, conda,
# the libtorch zip), while the default build uses Debian 12's 1.13: this compiles and tests the
# whole tree against 2.x, warnings as errors. The root is made once (mmdebstrap or debootstrap,
# from the Debian mirror this machine's apt uses; DTL_DEBIAN_MIRROR overrides), kept in
# build-torch2/root; its build folder is build-torch2/build (seen as build/ inside). Mounts live
# in a private mount namespace and vanish with the command. Needs root (or sudo): chroot.
TORCH2_SUITE=trixie
# What ./lab setup installs, and git (grading.release makes a release from a commit).
TORCH2_PACKAGES=("${PACKAGES[@]}" git)
cmd_torch2() {
  local args=() a
  for a in "$@"; do [ "$a" = --torch2 ] || args+=("$a"); done
  [ ${#args[@]} -gt 0 ] || args=(test)
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
      die "torch2: needs root (a chroot); run: sudo ./lab torch2 ${args[*]}"
    exec sudo -E "$ROOT/lab" torch2 "${args[@]}"
  fi
  local dir="$ROOT/build-torch2" root="$ROOT/build-torch2/root"
  torch2_make_root "$root"
  mkdir -p "$dir/build" "$root/dtl" "$ROOT/build"
  local cuda=""
  [ -e /usr/local/cuda/include/cuda_runtime.h ] && cuda=$(readlink -f /usr/local/cuda)
  say "torch2: ./lab ${args[*]} in the Debian 13 root (LibTorch $(torch2_version "$root")); build folder $dir/build"
  local start=$SECONDS rc=0
  # The CUDA toolkit, when this machine has one, is lent read-only at the same path: the NCCL
  # device layer then compiles against LibTorch 2.x too.
  DTL_T2_ROOT="$root" DTL_T2_SRC="$ROOT" DTL_T2_BUILD="$dir/build" DTL_T2_CUDA="$cuda" \
  unshare --mount --propagation private -- bash -c '
    set -e
    r=$DTL_T2_ROOT
    mount --bind "$DTL_T2_SRC" "$r/dtl"
    mount --bind "$DTL_T2_BUILD" "$r/dtl/build"
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    if [ -n "$DTL_T2_CUDA" ]; then
      mkdir -p "$r/usr/local/cuda"
      mount --bind -o ro "$DTL_T2_CUDA" "$r/usr/local/cuda"
    fi
    exec chroot "$r" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" CCACHE_DIR=/dtl/build/.ccache \
      DTL_JOBS="$DTL_JOBS" CI="$CI" \
      DTL_CMAKE_ARGS="-DDTL_WARNINGS_AS_ERRORS=ON $DTL_CMAKE_ARGS" \
      bash -c '"'"'cd /dtl; if [ "$1" = shell ]; then shift; exec bash ${1:+-c "$*"}; fi; exec ./lab "$@"'"'"' lab "$@"
  ' torch2 "${args[@]}" || rc=$?
  local t=$((SECONDS - start))
  say "torch2: ./lab ${args[*]} against LibTorch 2.x $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(clock $t)"
  return $rc
}

torch2_version() { dpkg-query --admindir="$1/var/lib/dpkg" -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?'; }

# The mirror this machine's apt uses (deb822 or one-line sources), else DTL_DEBIAN_MIRROR.
debian_mirror() {
  [ -n "${DTL_DEBIAN_MIRROR:-}" ] && { echo "$DTL_DEBIAN_MIRROR"; return; }
  local m
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}')
  [ -n "$m" ] || m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                     awk '/^deb / && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}')
  [ -n "$m" ] || die "torch2: no Debian mirror in /etc/apt; set DTL_DEBIAN_MIRROR=http://.../debian"
  echo "$m"
}

# torch2_make_root DIR: a Debian 13 root with TORCH2_PACKAGES, made once (remade when they change).
torch2_make_root() {
  local root=$1 want
  want="$TORCH2_SUITE ${TORCH2_PACKAGES[*]}"
  [ "$(cat "$root/.dtl-packages" 2>/dev/null)" = "$want" ] && return 0
  local tool=""
  command -v mmdebstrap >/dev/null && tool=mmdebstrap
  [ -z "$tool" ] && command -v debootstrap >/dev/null && tool=debootstrap
  if [ -z "$tool" ]; then
    say "torch2: installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null
    tool=mmdebstrap
  fi
  local mirror include; mirror=$(debian_mirror)
  include=$(IFS=,; echo "${TORCH2_PACKAGES[*]}")
  rm -rf "$root"; mkdir -p "$(dirname "$root")"
  say "torch2: making a Debian 13 root with $tool (about 1.4 GB, 2-5 minutes): $root"
  local start=$SECONDS
  if [ "$tool" = mmdebstrap ]; then
    mmdebstrap --variant=apt --include="$include" "$TORCH2_SUITE" "$root" "$mirror" >"$root.log" 2>&1
  else
    debootstrap --variant=minbase --include="$include" "$TORCH2_SUITE" "$root" "$mirror" >"$root.log" 2>&1
  fi || die "torch2: $tool failed (log: $root.log)"
  printf '%s' "$want" >"$root/.dtl-packages"
  say "torch2: root ready in $(clock $((SECONDS - start)))"
}
