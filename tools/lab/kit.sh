# Sourced by ./lab (which provides say, die, clock, build, configure, mpi_env, ROOT, BUILD and the
# rest of its helpers): ./lab kit, a kit for a bare GPU node.

# ---------------------------------------------------------------- a kit for a bare GPU node

# ./lab kit: on a machine with apt (Debian 12 or a container of it), everything dtl needs besides
# LibTorch, NCCL, the CUDA toolkit, a compiler, CMake and Ninja, as Debian packages unpacked into
# a prefix (dpkg -x, no root), packed as build/dtl-kit.tar.gz to carry to a GPU node that has
# no root and no apt. There, unpack it into the checkout (tar -C build -xzf
# dtl-kit.tar.gz): every ./lab command then finds it (build/kit/env.sh, or DTL_KIT=DIR), takes
# LibTorch from the Python that imports torch (torch.utils.cmake_prefix_path) and NCCL from pip's
# nvidia/nccl or the toolkit (cmake/FindNCCL.cmake), and installs nothing.
KIT_PACKAGES=(libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev libfmt-dev)
# Never in the kit: what every node has and must keep its own (the C and C++ runtimes), tools
# (compilers, perl, python), and development packages the kit's own -dev packages merely pull in.
KIT_SKIP='^(libc6|libc-bin|libc-dev-bin|libc6-dev|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libcrypt1|libcrypt-dev|linux-libc-dev|libnsl.*|libtirpc.*|debconf|dpkg|perl.*|libperl.*|python3.*|libpython.*|gcc.*|g\+\+.*|cpp.*|gfortran.*|binutils.*|libbinutils|libctf.*|libgprofng.*|libjansson4|libgfortran-[0-9]+-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libasan.*|liblsan.*|libtsan.*|libubsan.*|libhwasan.*|libitm.*|libatomic.*|libquadmath.*|libcc1.*|libgomp.*|libisl.*|libmpc.*|libmpfr.*|libgmp.*|libzstd1|zlib1g|liblzma5|libbz2.*|libssl.*|libsystemd.*|libudev1|libselinux1|libpcre.*|libcap.*|libgcrypt.*|libgpg-error.*|liblz4.*|libdb5.*|libgdbm.*|sensible-utils|libjs-.*|libevent-dev|libhwloc-dev|libibverbs-dev|libnl-.*-dev|libnuma-dev|libpmix-dev|libltdl-dev|libtool|zlib1g-dev|libxnvctrl.*|ibverbs-providers|libxml2|libicu.*|libxext.*|libx11.*|libxau.*|libxdmcp.*|libxcb.*|libbsd0|libmd0|x11-common|openssh-client|libkrb5.*|libgssapi.*|libk5crypto.*|libkeyutils1|libcom-err2|libedit2|libfido2.*|libcbor.*|libtinfo6|libncursesw6|libexpat1|libjs-jquery.*|libjs-jquery-ui|adduser|passwd|libpam.*|libaudit.*|libsemanage.*|libsepol.*|libuuid1|googletest|libhwloc-plugins)$'

cmd_kit() {
  [ "${1:-}" = --check ] && { kit_check; return; }
  command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
    die "kit: make the kit on a machine with apt (Debian 12, or a container of it), then carry build/dtl-kit.tar.gz to the GPU node"
  # Staged outside build/kit: a kit there would be used by this checkout's own ./lab commands.
  local stage="$ROOT/build/kit-stage" debs="$ROOT/build/kit-debs" archive="$ROOT/build/dtl-kit.tar.gz"
  local kit="$stage/kit"
  rm -rf "$debs"; mkdir -p "$debs"
  if [ "$(id -u)" -eq 0 ] && [ -z "$(ls /var/lib/apt/lists 2>/dev/null | grep -v lock)" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  fi
  say "kit: resolving ${KIT_PACKAGES[*]}"
  # The dependency closure, taking the first of alternatives (apt-cache's recursion takes them
  # all: every Fortran compiler that provides one).
  local all=() queue=("${KIT_PACKAGES[@]}") p d
  local -A seen=()
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    [ -n "${seen[$p]:-}" ] && continue
    seen[$p]=1; all+=("$p")
    for d in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                 --no-replaces --no-enhances "$p" 2>/dev/null |
               awk '/^  [|]?(Pre)?Depends:/ { if (!alt && $2 !~ /^</) print $2; alt = ($1 ~ /^[|]/) }'); do
      d=${d%%:*}
      [[ "$d" =~ $KIT_SKIP ]] || [ -n "${seen[$d]:-}" ] || queue+=("$d")
    done
  done
  say "kit: downloading ${#all[@]} packages into $debs"
  (cd "$debs" && apt-get download -q "${all[@]}" >/dev/null 2>&1) || die "kit: apt-get download failed"
  rm -rf "$stage"; mkdir -p "$kit/root"
  for p in "$debs"/*.deb; do dpkg -x "$p" "$kit/root"; done
  # What the packages' install scripts would do: the alternatives that name mpirun, mpicxx and
  # the MPI library.
  local bin="$kit/root/usr/bin" lib="$kit/root/usr/lib/x86_64-linux-gnu"
  for p in mpirun mpiexec mpicc mpicxx mpic++ mpiCC mpif77 mpif90 mpifort; do
    [ -e "$bin/$p.openmpi" ] && ln -sf "$p.openmpi" "$bin/$p"
  done
  rm -rf "$kit/root/usr/share/doc" "$kit/root/usr/share/man" "$kit/root/usr/share/lintian"
  cat >"$kit/env.sh" <<'ENV'
# dtl kit: sourced by ./lab (or by hand: . build/kit/env.sh). Libraries and CMake packages from
# the kit; OpenMPI from the kit only when the node has no mpirun of its own (module load openmpi
# wins: it knows the cluster's network and Slurm).
DTL_KIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/root"
export CMAKE_PREFIX_PATH="$DTL_KIT_ROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$DTL_KIT_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v mpirun >/dev/null 2>&1 || [ "$(command -v mpirun)" = "$DTL_KIT_ROOT/usr/bin/mpirun" ]; then
  export PATH="$DTL_KIT_ROOT/usr/bin:$PATH"
  export OPAL_PREFIX="$DTL_KIT_ROOT/usr"            # OpenMPI, relocated
  export PMIX_INSTALL_PREFIX="$DTL_KIT_ROOT/usr"    # its PMIx, and PMIx's plugins
  export PMIX_MCA_mca_base_component_path="$DTL_KIT_ROOT/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
  export OPAL_LIBDIR="$DTL_KIT_ROOT/usr/lib/x86_64-linux-gnu/openmpi/lib"
  export LD_LIBRARY_PATH="$OPAL_LIBDIR:$LD_LIBRARY_PATH"
  # OpenMPI 4 refuses to start without ssh or rsh on PATH, even on one node (a container, a
  # minimal node); inside a Slurm allocation it launches through Slurm and never uses them.
  command -v ssh >/dev/null 2>&1 || command -v rsh >/dev/null 2>&1 ||
    export OMPI_MCA_plm_rsh_agent=false
  export DTL_KIT_MPI=1
fi
ENV
  tar -C "$stage" -czf "$archive" kit
  say "kit: $archive ($(du -h "$archive" | cut -f1); $(du -sh "$kit" | cut -f1) unpacked, ${#all[@]} packages)"
  rm -rf "$stage"
  echo "  on the GPU node, in the checkout: mkdir -p build && tar -C build -xzf dtl-kit.tar.gz; then ./lab gpu-check" >&2
}

# ./lab kit --check: the kit on a bare node, rehearsed here. A Debian 12 root under
# build-kitnode/ with only g++, CMake, Ninja, Python and a LibTorch (Debian's 1.13 stands in for
# pip's: laid out under a Python package `torch` whose utils.cmake_prefix_path names its CMake
# files, carrying fmt 10 headers of its own as pip's wheels do, from Debian 13's libfmt-dev in the
# torch2 root); no OpenMPI, fmt, GoogleTest, Benchmark, JSON or CLI11. There, as an unprivileged
# user (useradd) in a clean environment (env -i): unpack build/dtl-kit.tar.gz into a copy of this
# checkout and run `./lab test 02 --solutions` (configure, build, mpirun at 1-4 ranks).
# Needs root (chroot).
kit_check() {
  [ "$(id -u)" -eq 0 ] || die "kit --check: needs root (a chroot)"
  local archive="$ROOT/build/dtl-kit.tar.gz" dir="$ROOT/build-kitnode" fmt10="$ROOT/build-torch2/root/usr/include/fmt"
  [ -f "$archive" ] || cmd_kit
  [ -f "$fmt10/format-inl.h" ] || die "kit --check: needs fmt 10 headers from the torch2 root: run ./lab torch2 shell true first"
  local root="$dir/root" want="bookworm g++ cmake ninja-build python3 libtorch-dev"
  if [ "$(cat "$root/.dtl-packages" 2>/dev/null)" != "$want" ]; then
    command -v mmdebstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
    rm -rf "$root"; mkdir -p "$dir"
    say "kit --check: a bare Debian 12 root (compiler, CMake, Ninja, Python, LibTorch): $root"
    mmdebstrap --variant=apt --include=g++,cmake,ninja-build,python3,libtorch-dev bookworm \
      "$root" "$(debian_mirror)" >"$root.log" 2>&1 || die "kit --check: mmdebstrap failed (log: $root.log)"
    printf '%s' "$want" >"$root/.dtl-packages"
  fi
  # The "pip" LibTorch: /usr/local/lib/python3.*/dist-packages/torch, fmt 10 in its include/.
  local site; site=$(ls -d "$root"/usr/lib/python3.[0-9]* | head -1); site="$root/usr/local/lib/$(basename "$site")/dist-packages"
  local t="$site/torch" f
  rm -rf "$t"; mkdir -p "$t/include" "$t/lib/x86_64-linux-gnu/cmake"
  cp -r "$root/usr/lib/x86_64-linux-gnu/cmake/Torch" "$root/usr/lib/x86_64-linux-gnu/cmake/Caffe2" "$t/lib/x86_64-linux-gnu/cmake/"
  for f in ATen c10 caffe2 torch; do ln -s "/usr/include/$f" "$t/include/$f"; done
  cp -r "$fmt10" "$t/include/fmt"
  for f in "$root"/usr/lib/x86_64-linux-gnu/lib{torch,c10,caffe2,shm}*.so*; do
    ln -s "/usr/lib/x86_64-linux-gnu/$(basename "$f")" "$t/lib/x86_64-linux-gnu/$(basename "$f")"
  done
  printf 'from . import utils\n__version__ = "1.13.1 (stand-in for a pip wheel)"\n' >"$t/__init__.py"
  printf 'import os\ncmake_prefix_path = os.path.join(os.path.dirname(__file__), "lib", "x86_64-linux-gnu", "cmake")\n' >"$t/utils.py"
  # The user, a copy of this checkout (what git would give: tracked and untracked, not ignored)
  # and the kit.
  chroot "$root" id dtl >/dev/null 2>&1 || chroot "$root" useradd -m -s /bin/bash dtl
  local home="$root/home/dtl"
  mkdir -p "$home/dtl"  # a second check keeps build/ (and so rebuilds only what changed)
  find "$home/dtl" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
  (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -C "$home/dtl" -xf -
  cp "$archive" "$home/"
  chroot "$root" chown -R dtl:dtl /home/dtl
  say "kit --check: as user dtl, env -i: unpack the kit, ./lab test 02 --solutions"
  local start=$SECONDS rc=0
  DTL_T2_ROOT="$root" DTL_JOBS="$JOBS" unshare --mount --propagation private -- bash -c '
    r=$DTL_T2_ROOT
    mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; mount --rbind /sys "$r/sys"
    exec chroot --userspec=dtl:dtl "$r" env -i HOME=/home/dtl PATH=/usr/bin:/bin LANG=C.UTF-8 \
      DTL_JOBS="$DTL_JOBS" bash -c "cd ~/dtl && id && mkdir -p build && rm -rf build/kit && tar -C build -xzf ~/dtl-kit.tar.gz &&
        ./lab test 02 --solutions && grep -E \"^(MPI_CXX_COMPILER|Torch_DIR|DTL_FMT_USED)[:]\" build/CMakeCache.txt"
  ' || rc=$?
  say "kit --check: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(clock $((SECONDS - start)))"
  return $rc
}

# The kit, when this checkout has one (build/kit, or DTL_KIT): its environment, and LibTorch from
# the Python that imports torch unless DTL_CMAKE_ARGS names one.
