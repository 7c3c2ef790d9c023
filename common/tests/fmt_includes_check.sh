#!/usr/bin/env bash
# ctest common.fmt_includes: every source that calls what fmt 11 moved out of <fmt/format.h>
# includes the header that now declares it. fmt 9 and 10 (Debian 12, 13) declare fmt::join in
# format.h, so a missing include compiles here and fails for every user of a LibTorch 2.5+ from
# pip, conda or the libtorch zip, whose fmt 11 headers the build uses (cmake/DtlFmt.cmake).
# `./lab gpu-build` compiles the tree against fmt 11 itself; this is CI's cheap guard.
# Usage: fmt_includes_check.sh REPO
set -euo pipefail
repo=${1:-.}
# what fmt 11 declares where (a call -> the header it needs)
rules=("fmt::join(|fmt/ranges.h" "fmt::localtime(|fmt/chrono.h" "fmt::gmtime(|fmt/chrono.h"
       "fmt::streamed(|fmt/ostream.h" "fmt::print(std::cout|fmt/ostream.h")
bad=""
while IFS= read -r f; do
  for rule in "${rules[@]}"; do
    call=${rule%%|*} header=${rule#*|}
    if grep -qF "$call" "$f" && ! grep -q "#include <$header>" "$f"; then
      bad+="  ${f#"$repo"/}: calls ${call%(} without #include <$header>"$'\n'
    fi
  done
done < <(find "$repo"/common "$repo"/harness "$repo"/labs "$repo"/solutions "$repo"/grading \
           \( -name '*.cpp' -o -name '*.hpp' \) -not -path '*/build*' 2>/dev/null)
if [ -n "$bad" ]; then
  printf 'fmt_includes: these sources compile against fmt 9/10 but not fmt 11:\n%s' "$bad"
  exit 1
fi
echo "fmt_includes: every fmt::join and friends has its fmt 11 header"
