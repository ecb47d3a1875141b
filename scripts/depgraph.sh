#!/usr/bin/env bash
# depgraph.sh [SOURCE_DIR [BUILD_DIR]] — the include and call graph of
# src/ and include/eldr/, and what in it goes against the layer table:
#
#   include loops   headers that include each other in a loop (each loop's
#                   members: a strongly connected component of the include
#                   graph with more than one header)
#   call loops      source files of the libraries and the program whose
#                   functions call each other in a loop (a file uses a
#                   symbol another defines: read from BUILD_DIR's object
#                   files with nm; skipped without a build)
#   layer rules     every include the layer table forbids: upward or
#                   sideways into a layer not listed, another directory's
#                   private header, an unlisted third-party library
#                   (tests/layers/check_layers.sh --report)
#
# SOURCE_DIR defaults to this checkout, BUILD_DIR to SOURCE_DIR/build. The
# table is SOURCE_DIR/src/layers.txt, or this checkout's when SOURCE_DIR has
# none (an older tree measured by today's rules). Prints counts and lists;
# exit 0 (a report, not a check: the ctest `layers` is the check).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "${1:-$here}" && pwd)
build=${2:-$src/build}
table=$src/src/layers.txt
[ -f "$table" ] || table=$here/src/layers.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$src"

# strongly connected components with more than one node of the edges
# "a b" on stdin: one line per component, its nodes sorted
scc() {
  awk '
    { if ($1 != $2) { adj[$1] = adj[$1] " " $2; nodes[$1]; nodes[$2] } }
    function reach(s,    q, h, t, u, v, i, n, a) {
      delete seen; h = 0; t = 0; q[t++] = s; seen[s] = 1
      while (h < t) {
        u = q[h++]; n = split(adj[u], a, " ")
        for (i = 1; i <= n; i++) { v = a[i]; if (!(v in seen)) { seen[v] = 1; q[t++] = v } }
      }
      for (v in seen) r[s, v] = 1
    }
    END {
      for (s in nodes) reach(s)
      for (s in nodes) {
        if (s in done) continue
        comp = s; k = 1
        for (v in nodes) if (v != s && ((s, v) in r) && ((v, s) in r)) { comp = comp "\n" v; done[v] = 1; k++ }
        done[s] = 1
        if (k > 1) { cmd = "sort | paste -sd\" \""; print comp | cmd; close(cmd) }
      }
    }'
}

# ---- include edges: file -> the header it includes ----------------------
# shellcheck disable=SC2046
awk '
  FNR == 1 { d = FILENAME; sub(/\/[^\/]*$/, "", d) }
  match($0, /^[ \t]*#[ \t]*include[ \t]*"[^"]*"/) {
    h = substr($0, RSTART, RLENGTH); sub(/^[^"]*"/, "", h); sub(/"$/, "", h)
    if (h ~ /^eldr\//) t = "include/" h; else if (h ~ /\//) t = "src/" h; else t = d "/" h
    print FILENAME, t
  }' $(ls include/eldr/*.h src/*/*.c src/*/*.h 2>/dev/null) |
  while read -r f t; do [ -f "$t" ] && echo "$f $t"; done >"$tmp/includes"
grep '\.h$' "$tmp/includes" | awk '$1 ~ /\.h$/' | scc >"$tmp/include_loops" || true

# ---- call edges: object -> object whose symbol it uses ------------------
calls=skipped
if [ -d "$build/CMakeFiles" ]; then
  calls=0
  find "$build/CMakeFiles" -path '*/CMakeFiles/*.dir/src/*' -name '*.c.o' | sort >"$tmp/objs"
  # nm -A: "object: symbol type ..."; the object's source is its path below <target>.dir/
  src_of='{ o = $1; sub(/:$/, "", o); sub(/^.*\/CMakeFiles\/[^\/]*\.dir\//, "", o); sub(/\.o$/, "", o) }'
  xargs nm -P -A --defined-only --extern-only <"$tmp/objs" 2>/dev/null |
    awk "$src_of"' $3 ~ /^[TDBRVWG]$/ {print $2, o}' | sort -u >"$tmp/defs"
  xargs nm -P -A --undefined-only <"$tmp/objs" 2>/dev/null | awk "$src_of"' {print $2, o}' | sort -u >"$tmp/uses"
  join "$tmp/uses" "$tmp/defs" | awk '$2 != $3 {print $2, $3}' | sort -u >"$tmp/calls"
  scc <"$tmp/calls" >"$tmp/call_loops" || true
  calls=$(wc -l <"$tmp/call_loops")
fi

"$here/tests/layers/check_layers.sh" --report "$src" "$table" >"$tmp/rules" || true

echo "# depgraph: $src (table: ${table#$here/})"
echo "files: $(ls src/*/*.c | wc -l) sources, $(ls src/*/*.h include/eldr/*.h | wc -l) headers; $(wc -l <"$tmp/includes") includes"
echo
echo "== include loops: $(wc -l <"$tmp/include_loops")"
sed 's/^/  /' "$tmp/include_loops"
echo
if [ "$calls" = skipped ]; then
  echo "== call loops: skipped (no build at $build)"
else
  echo "== call loops: $calls (over $(wc -l <"$tmp/calls") file-to-file call edges)"
  sed 's/^/  /' "$tmp/call_loops"
fi
echo
echo "== includes against the layer table: $(wc -l <"$tmp/rules")"
sed 's/^layer violation: /  /' "$tmp/rules"
