#!/usr/bin/env bash
# check_layers.sh SOURCE_DIR [TABLE] — the include rules of the layer table
# (TABLE, default SOURCE_DIR/src/layers.txt; docs/layers.md), over every
# #include of src/ and include/eldr/:
#   - every directory of src/ is a layer of the table;
#   - eldr/X.h belongs to the layer whose directory holds X.c (or the one a
#     `header` line names); a file may include it only from its own layer
#     or a layer its line lists;
#   - a header inside src/<dir>/ is private to that directory: no other
#     directory, and no public header, includes it;
#   - <lib/...> or <lib.h> of a third-party library only in a layer that
#     lists it;
#   - src/core does no file, stream or process I/O.
# Prints each violation; exit 1 if any.
#   --report  print the violations, exit 0 (scripts/depgraph.sh)
#   --table   print the table as markdown (docs/layers.md), exit 0
# (The layer_link_* build targets prove the same for calls: each library is
# linked whole with only the libraries its line lists.)
set -u
mode=check
case "${1:-}" in --report | --table) mode=${1#--}; shift ;; esac
cd "${1:?usage: check_layers.sh [--report|--table] SOURCE_DIR [TABLE]}" || exit 2
table=${2:-src/layers.txt}
[ -f "$table" ] || { echo "check_layers: no layer table $table" >&2; exit 2; }

declare -A DIR USES THIRD OWNER LAYER_OF_DIR LIB
order=()
while read -r name dir lib uses third _; do
  case "$name" in '' | \#*) continue ;; esac
  if [ "$name" = header ]; then OWNER[${dir%.h}]=$lib; continue; fi
  order+=("$name")
  DIR[$name]=$dir
  LAYER_OF_DIR[$dir]=$name
  USES[$name]=" ${uses//,/ } "
  THIRD[$name]=" ${third//,/ } "
  LIB[$name]=$lib
done <"$table"
known3p=$(for l in "${order[@]}"; do echo ${THIRD[$l]}; done | tr ' ' '\n' | grep -v '^-\?$' | sort -u | tr '\n' ' ')
known3p="$known3p cmocka"

if [ $mode = table ]; then
  echo "| layer | sources | library | may use | third-party headers |"
  echo "| --- | --- | --- | --- | --- |"
  for l in "${order[@]}"; do
    u=$(echo ${USES[$l]} | sed 's/ /, /g')
    t=$(echo ${THIRD[$l]} | sed 's/ /, /g')
    echo "| $l | \`${DIR[$l]}\` | \`${LIB[$l]}\` | ${u:--} | ${t:--} |"
  done
  exit 0
fi

bad=0
fail() { echo "layer violation: $*"; bad=1; }

# owners of the public headers: the layer whose directory holds X.c
for l in "${order[@]}"; do
  for c in ${DIR[$l]}/*.c; do
    [ -f "$c" ] || continue
    b=$(basename "$c" .c)
    [ -f "include/eldr/$b.h" ] && [ -z "${OWNER[$b]:-}" ] && OWNER[$b]=$l
  done
done
for h in include/eldr/*.h; do
  b=$(basename "$h" .h)
  [ -n "${OWNER[$b]:-}" ] || fail "$h belongs to no layer (no src/<layer>/$b.c, no header line in $table)"
done

# every directory of src/ is a layer
for d in src/*/; do
  d=${d%/}
  [ -n "${LAYER_OF_DIR[$d]:-}" ] || fail "$d is not a layer of $table"
done

# check FILE LAYER DIR (DIR: its src directory, or "" for a public header)
check() {
  local f=$1 l=$2 dir=$3 inc h o n
  while IFS= read -r inc; do
    case "$inc" in
    '"eldr/'*)
      h=${inc#\"eldr/}; h=${h%.h\"}
      o=${OWNER[$h]:-}
      if [ -z "$o" ]; then
        [ -f "include/eldr/$h.h" ] || fail "$f includes eldr/$h.h, which does not exist"
      elif [ "$o" != "$l" ] && [[ "${USES[$l]}" != *" $o "* ]]; then
        fail "$f includes eldr/$h.h ($o, a layer $l may not use)"
      fi ;;
    '"'*/*)
      h=${inc#\"}; h=${h%\"}
      if [ -z "$dir" ] || [ "src/${h%/*}" != "$dir" ]; then
        fail "$f includes $h (private to src/${h%/*})"
      fi ;;
    '"'*)
      h=${inc#\"}; h=${h%\"}
      [ -n "$dir" ] || fail "$f includes \"$h\" (a public header includes only eldr/ headers)" ;;
    '<'*)
      n=${inc#<}; n=${n%%[/>]*}; n=${n%.h}
      if [[ " $known3p " == *" $n "* ]] && [[ "${THIRD[$l]}" != *" $n "* ]]; then
        fail "$f includes ${inc} (third-party $n, not listed for $l)"
      fi ;;
    esac
  done < <(sed -n 's/^[ \t]*#[ \t]*include[ \t]*\(["<][^">]*[">]\).*/\1/p' "$f")
}

for l in "${order[@]}"; do
  d=${DIR[$l]}
  for f in "$d"/*.c "$d"/*.h; do
    [ -f "$f" ] && check "$f" "$l" "$d"
  done
done
for h in include/eldr/*.h; do
  b=$(basename "$h" .h)
  [ -n "${OWNER[$b]:-}" ] && check "$h" "${OWNER[$b]}" ""
done

# core does no I/O: no files, streams, descriptors or processes
if grep -nE '\b(fopen|fdopen|freopen|fread|fwrite|fgets|getline|fprintf|fputs|printf|puts|open|openat|read|write|pread|mmap|opendir|popen|system|eldr_read_file)[[:space:]]*\(' src/core/*.c; then
  fail "src/core does I/O (lines above)"
fi
grep -nE '#include (<fcntl\.h>|<unistd\.h>|<sys/mman\.h>|"eldr/readfile\.h")' src/core/*.c \
  && fail "src/core includes an I/O header (lines above)"

[ $mode = report ] && exit 0
[ $bad = 0 ] && echo "layers: ok (${order[*]}: $table)"
exit $bad
