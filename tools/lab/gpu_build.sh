# ./lab gpu-build: the GPU configuration of the whole tree, built and tested on a machine without
# a GPU (sourced by ./lab, which provides say, die, clock, debian_mirror).
#
# GPU users build against a CUDA LibTorch, CUDA and NCCL; the default build has none of them, so
# every DTL_TORCH_HAS_CUDA branch would otherwise first compile on somebody's GPU node. This makes
# a Debian 13 root (build-cuda/root, made once, ~9 GB) from Debian's contrib and non-free
# components: LibTorch 2.6 built with CUDA (libtorch-cuda-dev), the CUDA 12.4 toolkit
# (nvidia-cuda-toolkit), NCCL 2.22 (libnccl-dev), and fmt 11's headers (from Debian forky), which
# the build uses header-only as it does those a pip or conda LibTorch 2.5+ ships. Inside the root it
# runs `./lab build --gpu` (DTL_REQUIRE_GPU=ON: every lab, the NCCL tests, the smoke suite, the
# grader; warnings as errors) into build-cuda/build, then the tests of the runtime (the NCCL device
# layer on its fake CUDA, the no-device errors of `--device cuda`) and of the harness; with --all
# every test that runs without a GPU: the labs' reference, grading and skeleton tests and the
# grader's too (the self-test and the release check aside: they test the grader, not CUDA).
#
# Two packages stand in for what no machine here can install (dtl-cuda-stand-ins, made on the fly):
#   - nvidia-cudnn, which only downloads cuDNN from NVIDIA: an empty package satisfies the
#     dependency, and a stub libcudnn.so.9 (every cudnn* symbol LibTorch's CUDA library names,
#     none of them ever called without a GPU) satisfies the linker and the loader;
#   - the driver's libcuda1: CUDA's own stub libcuda.so (from nvidia-cuda-dev), which reports
#     "CUDA driver is a stub library" to every call: the no-GPU path.
GPUB_SUITE=trixie
GPUB_PACKAGES=(libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev libbenchmark-dev
               nlohmann-json3-dev libcli11-dev libfmt-dev cmake ninja-build ccache g++ pkg-config
               libopenblas0-serial libseccomp-dev git
               libtorch-cuda-dev nvidia-cuda-toolkit libnccl-dev)
GPUB_STANDINS=/usr/local/lib/dtl-stand-ins   # inside the root
GPUB_FMT=/opt/fmt11                           # inside the root: fmt 11's headers under usr/include

cmd_gpu_build() {
  local all=0 shell=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --all) all=1 ;;
      shell) shift; shell=(shell "$@"); break ;;
      *) die "gpu-build: unknown argument '$1' (see ./lab help)" ;;
    esac
    shift
  done
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
      die "gpu-build: needs root (a chroot); run: sudo ./lab gpu-build"
    exec sudo -E "$ROOT/lab" gpu-build "$@"
  fi
  local dir="$ROOT/build-cuda" root="$ROOT/build-cuda/root"
  gpub_make_root "$root"
  mkdir -p "$dir/build" "$root/dtl"
  local inner
  if [ ${#shell[@]} -gt 0 ]; then
    inner="${shell[*]:1}"
    [ -n "$inner" ] || inner=bash
  else
    # The runtime (the device layer on the fake CUDA; --device cuda with no GPU visible) and the
    # harness; --all: every lab's reference, grading and skeleton tests and the grader's too.
    local labels='^(common|harness)$'
    [ "$all" = 1 ] && labels='^(common|harness|grading|reference|skeleton)$'
    inner="./lab build --gpu && ctest --test-dir build-gpu --output-on-failure -j \"\${DTL_JOBS:-2}\" -L '$labels' -E 'grading\\.(selftest|release)' --no-tests=error"
  fi
  say "gpu-build: in the Debian 13 CUDA root ($(gpub_versions "$root")); build folder $dir/build"
  local start=$SECONDS rc=0
  DTL_GB_ROOT="$root" DTL_GB_SRC="$ROOT" DTL_GB_BUILD="$dir/build" DTL_GB_INNER="$inner" \
  DTL_GB_ARGS="-DDTL_WARNINGS_AS_ERRORS=ON -DDTL_FMT_INCLUDE_DIR=$GPUB_FMT/usr/include ${DTL_CMAKE_ARGS:-}" \
  unshare --mount --propagation private -- bash -c '
    set -e
    r=$DTL_GB_ROOT
    mount --bind "$DTL_GB_SRC" "$r/dtl"
    mkdir -p "$DTL_GB_SRC/build-gpu"
    mount --bind "$DTL_GB_BUILD" "$r/dtl/build-gpu"
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    # Torch_DIR names the CUDA LibTorch, so ./lab installs no Debian packages in here.
    exec chroot "$r" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" CCACHE_DIR=/dtl/build-gpu/.ccache \
      DTL_JOBS="$DTL_JOBS" CI="$CI" \
      DTL_CMAKE_ARGS="-DTorch_DIR=/usr/lib/x86_64-linux-gnu/cmake/Torch $DTL_GB_ARGS" \
      bash -c "cd /dtl && $DTL_GB_INNER"
  ' || rc=$?
  say "gpu-build: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(clock $((SECONDS - start)))"
  return $rc
}

gpub_versions() {
  local v="$1/var/lib/dpkg"
  printf 'LibTorch %s, CUDA %s, NCCL %s' \
    "$(dpkg-query --admindir="$v" -W -f='${Version}' libtorch-cuda-dev 2>/dev/null || echo '?')" \
    "$(dpkg-query --admindir="$v" -W -f='${Version}' nvidia-cuda-toolkit 2>/dev/null || echo '?')" \
    "$(dpkg-query --admindir="$v" -W -f='${Version}' libnccl-dev 2>/dev/null || echo '?')"
}

# gpub_make_root DIR: the Debian 13 root with GPUB_PACKAGES (made once, remade when the list
# changes), then the stand-ins and fmt 11 (redone when GPUB_FINISH changes).
GPUB_FINISH="stand-ins-3 fmt11"
gpub_make_root() {
  local root=$1 want mirror
  want="$GPUB_SUITE ${GPUB_PACKAGES[*]}"
  if [ "$(cat "$root/.dtl-packages" 2>/dev/null)" != "$want" ]; then
    command -v mmdebstrap >/dev/null || {
      say "gpu-build: installing mmdebstrap"
      DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null
    }
    local tmp include
    mirror=$(debian_mirror)
    tmp=$(mktemp -d)
    gpub_standins_deb "$tmp"
    include=$(IFS=,; echo "${GPUB_PACKAGES[*]}"),$tmp/dtl-cuda-stand-ins_1.0_amd64.deb
    rm -rf "$root"; mkdir -p "$(dirname "$root")"
    say "gpu-build: making a Debian 13 root with CUDA LibTorch (~4 GB download, ~8 GB): $root"
    local start=$SECONDS
    # The hook makes the local .deb visible to dpkg inside the root.
    mmdebstrap --variant=apt --components=main,contrib,non-free \
      --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
      --include="$include" "$GPUB_SUITE" "$root" "$mirror" >"$root.log" 2>&1 ||
      die "gpu-build: mmdebstrap failed (log: $root.log)"
    rm -rf "$tmp"
    printf '%s' "$want" >"$root/.dtl-packages"
    say "gpu-build: root made in $(clock $((SECONDS - start)))"
  fi
  if [ "$(cat "$root/.dtl-finish" 2>/dev/null)" != "$GPUB_FINISH" ]; then
    mirror=$(debian_mirror)
    gpub_finish_root "$root" "$mirror" >>"$root.log" 2>&1 ||
      die "gpu-build: finishing the root (fmt 11, the stand-in libraries) failed (log: $root.log)"
    printf '%s' "$GPUB_FINISH" >"$root/.dtl-finish"
  fi
}

# The stand-in package: provides nvidia-cudnn and the driver's libcuda1, holds no files.
gpub_standins_deb() {
  local d="$1/pkg"
  mkdir -p "$d/DEBIAN"
  cat >"$d/DEBIAN/control" <<'EOF'
Package: dtl-cuda-stand-ins
Version: 1.0
Architecture: amd64
Maintainer: dtl <dtl@localhost>
Provides: nvidia-cudnn (= 9.0.0.312~cuda12), libcuda1 (= 550.0), libcuda.so.1 (= 550.0)
Conflicts: nvidia-cudnn, libcuda1
Description: stand-ins for nvidia-cudnn and the driver's libcuda1 (dtl's GPU build root)
 Only satisfies the dependencies: ./lab gpu-build adds stub libraries of its own.
EOF
  dpkg-deb --build "$d" "$1/dtl-cuda-stand-ins_1.0_amd64.deb" >/dev/null
}

# Inside the root: fmt 11's headers from Debian forky (pinned so nothing else comes from it), the
# stub libcudnn and libcuda for the linker and loader.
gpub_finish_root() {
  local root=$1 mirror=$2
  chroot "$root" bash -euc "
    echo 'deb [check-valid-until=no] $mirror forky main' >/etc/apt/sources.list.d/forky.list
    printf 'Package: *\nPin: release n=forky\nPin-Priority: 1\n' >/etc/apt/preferences.d/forky
    apt-get update -q
    cd /tmp && apt-get download -q libfmt-dev/forky
    rm -rf $GPUB_FMT && dpkg -x libfmt-dev_*.deb $GPUB_FMT && rm -f libfmt-dev_*.deb
    grep -q 'define FMT_VERSION 11' $GPUB_FMT/usr/include/fmt/base.h
    rm /etc/apt/sources.list.d/forky.list /etc/apt/preferences.d/forky && apt-get update -q
    mkdir -p $GPUB_STANDINS
    stub=\$(ls /usr/lib/x86_64-linux-gnu/stubs/libcuda.so /usr/lib/cuda/lib64/stubs/libcuda.so 2>/dev/null | head -1)
    [ -n \"\$stub\" ] && ln -sf \"\$stub\" $GPUB_STANDINS/libcuda.so.1
    tc=\$(ls /usr/lib/x86_64-linux-gnu/libtorch_cuda.so* | head -1)
    for lib in \$(objdump -p \"\$tc\" | awk '/NEEDED/ && \$2 ~ /^libcudnn/ {print \$2}'); do
      nm -D --undefined-only \"\$tc\" | awk '\$2 ~ /^cudnn/ {sub(/@.*/, \"\", \$2); print \"void \" \$2 \"(void) {}\"}' |
        sort -u >/tmp/cudnn_stub.c
      # LibTorch asks for each symbol at the version cuDNN defines (cudnnX@libcudnn.so.9).
      echo \"\$lib { global: *; };\" >/tmp/cudnn_stub.map
      gcc -shared -fPIC -o $GPUB_STANDINS/\$lib -Wl,-soname,\$lib \
        -Wl,--version-script=/tmp/cudnn_stub.map /tmp/cudnn_stub.c
    done
    echo $GPUB_STANDINS >/etc/ld.so.conf.d/dtl-stand-ins.conf && ldconfig
    missing=\$(ldd \"\$tc\" | awk '/not found/ {print \$1}')
    [ -z \"\$missing\" ] || { echo \"libtorch_cuda still lacks: \$missing\"; exit 1; }
  "
}
