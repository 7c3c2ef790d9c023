# Sourced by ./lab (which provides say, die, clock, build, configure, mpi_env, ROOT, BUILD and the
# rest of its helpers): ./lab kit, a kit for a bare GPU node.

# ---------------------------------------------------------------- a kit for a bare GPU node

# ./lab kit: on any machine with apt (Debian or Ubuntu, root not needed), everything dtl needs
# besides LibTorch, NCCL, the CUDA toolkit, a compiler, CMake and Ninja, as Debian packages
# unpacked into a prefix (dpkg -x), packed as build/dtl-kit.tar.gz to carry to a GPU node that has
# no root and no apt. There, unpack it into the checkout (tar -C build -xzf dtl-kit.tar.gz):
# every ./lab command then finds it (build/kit/env.sh, or DTL_KIT=DIR), takes LibTorch from the
# Python that imports torch (torch.utils.cmake_prefix_path) and NCCL from pip's nvidia/nccl or
# the toolkit (cmake/FindNCCL.cmake), and installs nothing.
#
# Which Debian: a library runs on any glibc at least as new as the one it was built against, and
# clusters run old systems (Ubuntu 20.04 and 22.04, RHEL 9: glibc 2.31-2.35). So the kit's
# libraries come from Debian 11 (bullseye), through an apt configuration of its own
# (build/kit-apt), whatever this machine runs; DTL_KIT_SUITE=bookworm makes a Debian 12 kit. Two
# header-only packages come from Debian 12, where Debian 11's are missing or too old (CLI11: none;
# fmt 7: dtl needs 8 for fmt::format_string): headers need no glibc, and fmt is used header-only
# (its library is left out).
KIT_PACKAGES=(libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev libfmt-dev libseccomp-dev)
KIT_SUITE="${DTL_KIT_SUITE:-bullseye}"
KIT_HEADERS_FROM_BOOKWORM=(libcli11-dev libfmt-dev)
# Never in the kit: what every node has and must keep its own (the C and C++ runtimes), tools
# (compilers, perl, python), and development packages the kit's own -dev packages merely pull in.
KIT_SKIP='^(libc6|libc-bin|libc-dev-bin|libc6-dev|libgcc-s1|libgcc1|libstdc\+\+6|gcc-[0-9]+-base|libcrypt1|libcrypt-dev|linux-libc-dev|libnsl.*|libtirpc.*|debconf|dpkg|perl.*|libperl.*|python3.*|libpython.*|gcc.*|g\+\+.*|cpp.*|gfortran.*|binutils.*|libbinutils|libctf.*|libgprofng.*|libjansson4|libgfortran-[0-9]+-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libasan.*|liblsan.*|libtsan.*|libubsan.*|libhwasan.*|libitm.*|libatomic.*|libquadmath.*|libcc1.*|libgomp.*|libisl.*|libmpc.*|libmpfr.*|libgmp.*|libzstd1|zlib1g|liblzma5|libbz2.*|libssl.*|libsystemd.*|libudev1|libselinux1|libpcre.*|libcap.*|libgcrypt.*|libgpg-error.*|liblz4.*|libdb5.*|libgdbm.*|sensible-utils|libjs-.*|libevent-dev|libhwloc-dev|libibverbs-dev|libnl-.*-dev|libnuma-dev|libpmix-dev|libltdl-dev|libtool|zlib1g-dev|libxnvctrl.*|ibverbs-providers|libxml2|libicu.*|libxext.*|libx11.*|libxau.*|libxdmcp.*|libxcb.*|libbsd0|libmd0|x11-common|openssh-client|libkrb5.*|libgssapi.*|libk5crypto.*|libkeyutils1|libcom-err2|libedit2|libfido2.*|libcbor.*|libtinfo6|libncursesw6|libexpat1|libjs-jquery.*|libjs-jquery-ui|adduser|passwd|libpam.*|libaudit.*|libsemanage.*|libsepol.*|libuuid1|googletest|libhwloc-plugins|libfmt[0-9]+)$'

# apt with the kit's own sources, lists and cache under build/kit-apt: the kit's Debian release
# at priority 900, Debian 12 at 100 (only what the first lacks), Debian 13 at 1 (only when named
# as pkg/trixie: the fmt of the check's pip-like LibTorch). No root: nothing of this machine's
# apt is read or written.
KIT_APT=()
kit_apt_setup() {
  local dir="$ROOT/build/kit-apt" mirror keyring="${DTL_KIT_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}" s
  [ -f "$keyring" ] || die "kit: no Debian archive keyring at $keyring (apt-get install debian-archive-keyring, or set DTL_KIT_KEYRING)"
  mirror=$(debian_mirror)
  mkdir -p "$dir"/{lists/partial,cache/archives/partial,etc/preferences.d}
  : >"$dir/status"
  # Rewritten only when it changes: its time says whether the lists are of this configuration.
  for s in "$KIT_SUITE" "$KIT_SUITE-updates" bookworm trixie; do
    echo "deb [signed-by=$keyring] $mirror $s main"
  done | awk '!seen[$0]++' >"$dir/etc/sources.list.new"
  if cmp -s "$dir/etc/sources.list.new" "$dir/etc/sources.list"; then
    rm -f "$dir/etc/sources.list.new"
  else
    mv "$dir/etc/sources.list.new" "$dir/etc/sources.list"
  fi
  {
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 900\n\n' "$KIT_SUITE" "$KIT_SUITE-updates"
    [ "$KIT_SUITE" = bookworm ] || printf 'Package: *\nPin: release n=bookworm\nPin-Priority: 100\n\n'
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 1\n\n'
    [ "$KIT_SUITE" = bookworm ] ||
      printf 'Package: %s\nPin: release n=bookworm\nPin-Priority: 950\n\n' "${KIT_HEADERS_FROM_BOOKWORM[@]}"
  } >"$dir/etc/preferences"
  KIT_APT=(-o "Dir::Etc=$dir/etc" -o "Dir::Etc::sourcelist=$dir/etc/sources.list" -o Dir::Etc::sourceparts=-
           -o "Dir::Etc::preferences=$dir/etc/preferences" -o "Dir::Etc::preferencesparts=$dir/etc/preferences.d"
           -o "Dir::State=$dir" -o "Dir::State::Lists=$dir/lists" -o "Dir::State::status=$dir/status"
           -o "Dir::Cache=$dir/cache" -o APT::Architecture=amd64 -o APT::Architectures::=amd64
           -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
  # The lists are kept a day; a different suite or mirror writes a different sources.list.
  if [ -z "$(find "$dir/lists/.updated" -newer "$dir/etc/sources.list" -mmin -1440 2>/dev/null)" ]; then
    say "kit: apt lists of Debian $KIT_SUITE from $mirror"
    apt-get "${KIT_APT[@]}" update -q >"$dir/update.log" 2>&1 || die "kit: apt-get update failed (log: $dir/update.log)"
    touch "$dir/lists/.updated"
  fi
}

# The newest glibc symbol version any ELF file under DIR needs (objdump -T), e.g. 2.31.
kit_glibc_needed() {
  # objdump fails on the scripts among the executables: its status means nothing here.
  { find "$1" -type f \( -name '*.so*' -o -perm -u+x \) -print0 | xargs -0 objdump -T 2>/dev/null || true; } |
    grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1
}

cmd_kit() {
  case "${1:-}" in
    --check) kit_check; return ;;
    --probe) kit_probe; return ;;
    "") ;;
    *) die "kit: unknown option '$1' (kit, kit --probe, kit --check)" ;;
  esac
  command -v apt-get >/dev/null && command -v dpkg >/dev/null && command -v objdump >/dev/null ||
    die "kit: make the kit on a machine with apt, dpkg and objdump (Debian or Ubuntu), then carry build/dtl-kit.tar.gz to the GPU node"
  # Staged outside build/kit: a kit there would be used by this checkout's own ./lab commands.
  local stage="$ROOT/build/kit-stage" debs="$ROOT/build/kit-debs" archive="$ROOT/build/dtl-kit.tar.gz"
  local kit="$stage/kit"
  rm -rf "$debs"; mkdir -p "$debs"
  kit_apt_setup
  say "kit: resolving ${KIT_PACKAGES[*]} (Debian $KIT_SUITE)"
  # The dependency closure, taking the first of alternatives (apt-cache's recursion takes them
  # all: every Fortran compiler that provides one).
  local all=() queue=("${KIT_PACKAGES[@]}") p d
  local -A seen=()
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    [ -n "${seen[$p]:-}" ] && continue
    seen[$p]=1; all+=("$p")
    for d in $(apt-cache "${KIT_APT[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                 --no-replaces --no-enhances "$p" 2>/dev/null |
               awk '/^  [|]?(Pre)?Depends:/ { if (!alt && $2 !~ /^</) print $2; alt = ($1 ~ /^[|]/) }'); do
      d=${d%%:*}
      [[ "$d" =~ $KIT_SKIP ]] || [ -n "${seen[$d]:-}" ] || queue+=("$d")
    done
  done
  say "kit: downloading ${#all[@]} packages into $debs"
  (cd "$debs" && apt-get "${KIT_APT[@]}" download -q "${all[@]}" >download.log 2>&1) ||
    die "kit: apt-get download failed (log: $debs/download.log)"
  rm -rf "$stage"; mkdir -p "$kit/root"
  for p in "$debs"/*.deb; do dpkg -x "$p" "$kit/root"; done
  # What the packages' install scripts would do: the alternatives that name mpirun, mpicxx and
  # the MPI library.
  local bin="$kit/root/usr/bin" lib="$kit/root/usr/lib/x86_64-linux-gnu"
  for p in mpirun mpiexec mpicc mpicxx mpic++ mpiCC mpif77 mpif90 mpifort; do
    [ -e "$bin/$p.openmpi" ] && ln -sf "$p.openmpi" "$bin/$p"
  done
  # CMake packages that name a system library by its path on the Debian they were built on
  # (Debian 11's Benchmark: /usr/lib/x86_64-linux-gnu/librt.so, which glibc 2.34 and later no
  # longer has): by name instead, which every glibc links.
  find "$lib/cmake" -name '*.cmake' -exec sed -i -E 's@/usr/lib/x86_64-linux-gnu/lib(rt|dl|m|pthread)\.so@\1@g' {} +
  # fmt, header-only: no library, no CMake package (cmake/DtlFmt.cmake then takes the headers).
  rm -rf "$lib"/libfmt.so* "$lib/cmake/fmt" "$lib/pkgconfig/fmt.pc"
  rm -rf "$kit/root/usr/share/doc" "$kit/root/usr/share/man" "$kit/root/usr/share/lintian"
  local glibc; glibc=$(kit_glibc_needed "$kit/root")
  [ -n "$glibc" ] || die "kit: no glibc version found in the kit's binaries (objdump -T)"
  cat >"$kit/env.sh" <<ENV
# dtl kit: sourced by ./lab (or by hand: . build/kit/env.sh). Libraries and CMake packages from
# the kit; OpenMPI from the kit only when the node has no mpirun of its own (module load openmpi
# wins: it knows the cluster's network and Slurm).
DTL_KIT_SUITE=$KIT_SUITE
DTL_KIT_GLIBC=$glibc  # the newest glibc symbol version the kit's binaries need
ENV
  cat >>"$kit/env.sh" <<'ENV'
DTL_KIT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/root"
export CMAKE_PREFIX_PATH="$DTL_KIT_ROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$DTL_KIT_ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v mpirun >/dev/null 2>&1 || [ "$(command -v mpirun)" = "$DTL_KIT_ROOT/usr/bin/mpirun" ]; then
  export PATH="$DTL_KIT_ROOT/usr/bin:$PATH"
  export OPAL_PREFIX="$DTL_KIT_ROOT/usr"            # OpenMPI, relocated
  export PMIX_INSTALL_PREFIX="$DTL_KIT_ROOT/usr"    # its PMIx, and PMIx's plugins
  for _dtl_pmix in "$DTL_KIT_ROOT"/usr/lib/x86_64-linux-gnu/pmix*/lib/pmix; do
    [ -d "$_dtl_pmix" ] && export PMIX_MCA_mca_base_component_path="$_dtl_pmix"
  done
  unset _dtl_pmix
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
  say "kit: $archive ($(du -h "$archive" | cut -f1); $(du -sh "$kit" | cut -f1) unpacked, ${#all[@]} packages from Debian $KIT_SUITE; needs glibc >= $glibc)"
  rm -rf "$stage"
  echo "  on the GPU node, in the checkout: mkdir -p build && tar -C build -xzf dtl-kit.tar.gz; then ./lab kit --probe, ./lab gpu-check" >&2
}

# The kit's glibc against this node's: a kit from a newer Debian than the node fails at its first
# link with undefined GLIBC_2.3x symbols; say so before anything is built.
kit_glibc_ok() {
  local have
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  [ -n "$have" ] && [ -n "${DTL_KIT_GLIBC:-}" ] || return 0
  [ "$(printf '%s\n%s\n' "$DTL_KIT_GLIBC" "$have" | sort -V | head -1)" = "$DTL_KIT_GLIBC" ] ||
    die "kit: made from Debian ${DTL_KIT_SUITE:-?} packages, which need glibc >= $DTL_KIT_GLIBC; this node has glibc $have. Make the kit with an older DTL_KIT_SUITE, or use the cluster's modules (notes/gpu.md, \"A bare GPU node\")"
}

# ./lab kit --probe: on the node, before the long build: the kit's libraries compiled with this
# node's compiler into tools/kit_probe (no LibTorch needed, CMake 3.18 enough), run under mpirun
# at 1 and 4 ranks.
kit_probe() {
  local kit="${DTL_KIT:-$ROOT/build/kit}" dir="$ROOT/build/kit-probe" n
  [ -f "$kit/env.sh" ] || die "kit --probe: no kit at $kit (unpack dtl-kit.tar.gz into build/, or set DTL_KIT)"
  # shellcheck disable=SC1091
  . "$kit/env.sh"
  kit_glibc_ok
  say "kit --probe: building tools/kit_probe with the kit (Debian ${DTL_KIT_SUITE:-?}, glibc >= ${DTL_KIT_GLIBC:-?}) in $dir"
  cmake -S "$ROOT/tools/kit_probe" -B "$dir" -G Ninja >"$dir.log" 2>&1 &&
    cmake --build "$dir" >>"$dir.log" 2>&1 || { tail -30 "$dir.log" >&2; die "kit --probe: the build failed (log: $dir.log)"; }
  mpi_env
  for n in 1 4; do
    timeout 120 "${MPIRUN[@]}" -np "$n" "$dir/kit_probe" >"$dir.run$n.log" 2>&1 ||
      { tail -30 "$dir.run$n.log" >&2; die "kit --probe: failed at $n ranks (log: $dir.run$n.log)"; }
    grep '^kit probe:' "$dir.run$n.log" >&2
  done
}

# ./lab kit --check: the kit on bare nodes, rehearsed here (needs root: chroots), each time as an
# unprivileged user (useradd) in a clean environment (env -i) with a copy of this checkout (what
# git would give: tracked and untracked, not ignored) and build/dtl-kit.tar.gz unpacked into it:
#   1. an old node: a Debian 11 root (glibc 2.31, g++ 10, CMake 3.18) with only a compiler, CMake,
#      Ninja and Python: `./lab kit --probe`. Debian 11 has no LibTorch and no CMake 3.25, which a
#      real node gets from pip; the probe covers the kit's part: its libraries, compiled and
#      linked by that compiler, run under its mpirun.
#   2. the whole path: a Debian 12 root with a compiler, CMake, Ninja, Python and a LibTorch
#      (Debian's 1.13 laid out as pip's: a Python package `torch` whose utils.cmake_prefix_path
#      names its CMake files, with fmt 10 headers of its own, from Debian 13's libfmt-dev):
#      `./lab test 02 --solutions` (configure, build, mpirun at 1-4 ranks).
# DTL_KIT_CHECK=old or full runs one of them.
kit_check() {
  [ "$(id -u)" -eq 0 ] || die "kit --check: needs root (chroots)"
  local archive="$ROOT/build/dtl-kit.tar.gz" which="${DTL_KIT_CHECK:-old full}" rc=0 start
  [ -f "$archive" ] || cmd_kit ""
  if [[ " $which " == *" old "* ]]; then
    start=$SECONDS
    kit_node_root "$ROOT/build-kitnode11" bullseye "g++,cmake,ninja-build,python3"
    say "kit --check (Debian 11, glibc $(chroot "$ROOT/build-kitnode11/root" getconf GNU_LIBC_VERSION | awk '{print $2}')): as user dtl, env -i: unpack the kit, ./lab kit --probe"
    kit_as_node_user "$ROOT/build-kitnode11/root" "./lab kit --probe" || rc=1
    say "kit --check (Debian 11): $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(clock $((SECONDS - start)))"
    [ $rc -eq 0 ] || return $rc
  fi
  if [[ " $which " == *" full "* ]]; then
    start=$SECONDS
    local root="$ROOT/build-kitnode/root"
    kit_node_root "$ROOT/build-kitnode" bookworm "g++,cmake,ninja-build,python3,libtorch-dev"
    kit_pip_torch_standin "$root"
    say "kit --check (Debian 12): as user dtl, env -i: unpack the kit, ./lab test 02 --solutions"
    kit_as_node_user "$root" './lab test 02 --solutions && grep -E "^(MPI_CXX_COMPILER|Torch_DIR|DTL_FMT_USED)[:]" build/CMakeCache.txt' || rc=1
    say "kit --check (Debian 12): $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(clock $((SECONDS - start)))"
  fi
  return $rc
}

# A bare node's root under DIR/root (made once per package list): Debian SUITE with PACKAGES.
kit_node_root() {
  local dir=$1 suite=$2 packages=$3 root="$1/root"
  local want="$suite $packages"
  [ "$(cat "$root/.dtl-packages" 2>/dev/null)" = "$want" ] && return 0
  command -v mmdebstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
  rm -rf "$root"; mkdir -p "$dir"
  say "kit --check: a bare Debian $suite root ($packages): $root"
  mmdebstrap --variant=apt --include="$packages" "$suite" "$root" "$(debian_mirror)" >"$root.log" 2>&1 ||
    die "kit --check: mmdebstrap failed (log: $root.log)"
  printf '%s' "$want" >"$root/.dtl-packages"
}

# The "pip" LibTorch in ROOT: /usr/local/lib/python3.*/dist-packages/torch over Debian's
# libtorch-dev, with fmt 10's headers in its include/ as pip's wheels carry theirs.
kit_pip_torch_standin() {
  local root=$1 site t f fmtdeb="$ROOT/build/kit-apt/fmt10"
  site=$(ls -d "$root"/usr/lib/python3.[0-9]* | head -1); site="$root/usr/local/lib/$(basename "$site")/dist-packages"
  t="$site/torch"
  rm -rf "$t"; mkdir -p "$t/include" "$t/lib/x86_64-linux-gnu/cmake"
  cp -r "$root/usr/lib/x86_64-linux-gnu/cmake/Torch" "$root/usr/lib/x86_64-linux-gnu/cmake/Caffe2" "$t/lib/x86_64-linux-gnu/cmake/"
  for f in ATen c10 caffe2 torch; do ln -s "/usr/include/$f" "$t/include/$f"; done
  kit_apt_setup
  rm -rf "$fmtdeb"; mkdir -p "$fmtdeb"
  (cd "$fmtdeb" && apt-get "${KIT_APT[@]}" download -q libfmt-dev/trixie >/dev/null 2>&1) ||
    die "kit --check: could not download Debian 13's libfmt-dev"
  dpkg -x "$fmtdeb"/libfmt-dev_*.deb "$fmtdeb/x"
  cp -r "$fmtdeb/x/usr/include/fmt" "$t/include/fmt"
  for f in "$root"/usr/lib/x86_64-linux-gnu/lib{torch,c10,caffe2,shm}*.so*; do
    ln -s "/usr/lib/x86_64-linux-gnu/$(basename "$f")" "$t/lib/x86_64-linux-gnu/$(basename "$f")"
  done
  printf 'from . import utils\n__version__ = "1.13.1 (stand-in for a pip wheel)"\n' >"$t/__init__.py"
  printf 'import os\ncmake_prefix_path = os.path.join(os.path.dirname(__file__), "lib", "x86_64-linux-gnu", "cmake")\n' >"$t/utils.py"
}

# COMMAND as user dtl in ROOT (env -i), in ~/dtl: a copy of this checkout with the kit unpacked
# into its build/ (a second check keeps build/, and so rebuilds only what changed).
kit_as_node_user() {
  local root=$1 cmd=$2 home="$1/home/dtl"
  chroot "$root" id dtl >/dev/null 2>&1 || chroot "$root" useradd -m -s /bin/bash dtl
  mkdir -p "$home/dtl"
  find "$home/dtl" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
  (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -C "$home/dtl" -xf -
  cp "$ROOT/build/dtl-kit.tar.gz" "$home/"
  chroot "$root" chown -R dtl:dtl /home/dtl
  DTL_T2_ROOT="$root" DTL_JOBS="$JOBS" DTL_NODE_CMD="$cmd" unshare --mount --propagation private -- bash -c '
    r=$DTL_T2_ROOT
    mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; mount --rbind /sys "$r/sys"
    exec chroot --userspec=dtl:dtl "$r" env -i HOME=/home/dtl PATH=/usr/bin:/bin LANG=C.UTF-8 \
      DTL_JOBS="$DTL_JOBS" DTL_NODE_CMD="$DTL_NODE_CMD" \
      bash -c "cd ~/dtl && id && mkdir -p build && rm -rf build/kit && tar -C build -xzf ~/dtl-kit.tar.gz && eval \"\$DTL_NODE_CMD\""
  '
}

# The kit, when this checkout has one (build/kit, or DTL_KIT): its environment, and LibTorch from
# the Python that imports torch unless DTL_CMAKE_ARGS names one.
use_kit() {
  local kit="${DTL_KIT:-$ROOT/build/kit}"
  [ -f "$kit/env.sh" ] || return 0
  # shellcheck disable=SC1091
  . "$kit/env.sh"
  kit_glibc_ok
  if [[ "${DTL_CMAKE_ARGS:-}" != *Torch_DIR* ]]; then
    local py prefix
    for py in ${DTL_PYTHON:-} python3 python; do
      prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) && break
    done
    [ -n "$prefix" ] && [ -d "$prefix/Torch" ] ||
      die "kit: no LibTorch: no Python here imports torch (tried ${DTL_PYTHON:+$DTL_PYTHON, }python3, python); pip install torch, or set DTL_CMAKE_ARGS=-DTorch_DIR=/path/to/libtorch/share/cmake/Torch"
    export DTL_CMAKE_ARGS="${DTL_CMAKE_ARGS:-} -DTorch_DIR=$prefix/Torch"
  fi
}
