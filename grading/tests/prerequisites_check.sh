#!/usr/bin/env bash
# prerequisites_check.sh ROOT: a lab's prerequisites are the labs whose reference solutions its
# CMakeLists.txt DEPENDS on (dtl_labMM_reference); labs/SYLLABUS.md's "prerequisites" column and
# the handout's "Prerequisites:" line must name exactly those. Checks the labs the tree has (a
# student release has some of them).
set -u
root=$1
bad=0
numbers() { grep -o '[0-9][0-9]' | sort -u | paste -sd' '; }
for d in "$root"/labs/[0-9][0-9]_*/; do
  [ -f "$d/CMakeLists.txt" ] || continue
  n=$(basename "$d" | cut -c1-2)
  want=$(grep -o 'dtl_lab[0-9][0-9]_reference' "$d/CMakeLists.txt" | numbers)
  # | lab | directory | title | prerequisites | effort | status |
  row=$(grep -m1 "^| $n |" "$root/labs/SYLLABUS.md")
  got=$(awk -F'|' '{print $5}' <<<"$row" | numbers)
  if [ -z "$row" ] || [ "$got" != "$want" ]; then
    echo "lab $n: labs/SYLLABUS.md's prerequisites are '${got:-none}', its CMakeLists.txt DEPENDS on '${want:-none}'"
    bad=1
  fi
  line=$(grep -m1 '^Prerequisites: ' "$d/README.md")
  got=$(sed 's/(.*//' <<<"$line" | numbers)
  if [ -z "$line" ] || [ "$got" != "$want" ]; then
    echo "lab $n: the handout's 'Prerequisites:' line ${line:+names '${got:-none}'}${line:-is missing}; its CMakeLists.txt DEPENDS on '${want:-none}'"
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "prerequisites: the syllabus and every handout match the labs' DEPENDS"
exit "$bad"
