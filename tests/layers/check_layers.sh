#!/usr/bin/env bash
# check_layers.sh SOURCE_DIR — the include rules between the layers
# (docs/architecture.md): base includes only base headers; core and the
# core headers it includes never include a format, sim or network header;
# src/core does no file or stream I/O. Prints each violation; exit 1 if any.
# (The layer_link_* build targets prove the same for calls: each library is
# linked whole with only the layers below it.)
set -u
cd "${1:?usage: check_layers.sh SOURCE_DIR}"
bad=0
fail() { echo "layer violation: $*"; bad=1; }

# base: eldr/X.h only when src/base/X.c exists
for f in src/base/*.c; do
  for h in $(sed -n 's|^#include "eldr/\([a-z_0-9]*\)\.h".*|\1|p' "$f"); do
    [ -f "src/base/$h.c" ] || fail "$f includes eldr/$h.h (not a base header)"
  done
done

# headers of the layers above core
above="trace artifact routed_experts preset_files sim serve worker loadgen sweep cluster"
# core sources, and the eldr headers they reach (transitively)
todo=$(ls src/core/*.c src/core/*.h 2>/dev/null)
seen=""
while [ -n "$todo" ]; do
  next=""
  for f in $todo; do
    for h in $(sed -n 's|^#include "eldr/\([a-z_0-9]*\)\.h".*|\1|p' "$f"); do
      for a in $above; do [ "$h" = "$a" ] && fail "$f includes eldr/$h.h (a layer above core)"; done
      case " $seen " in *" $h "*) ;; *) seen="$seen $h"; [ -f "include/eldr/$h.h" ] && next="$next include/eldr/$h.h" ;; esac
    done
  done
  todo=$next
done

# core does no I/O: no files, streams, descriptors or processes
if grep -nE '\b(fopen|fdopen|freopen|fread|fwrite|fgets|getline|fprintf|fputs|printf|puts|open|openat|read|write|pread|mmap|opendir|popen|system|eldr_read_file)[[:space:]]*\(' src/core/*.c; then
  fail "src/core does I/O (lines above)"
fi
grep -nE '#include (<fcntl\.h>|<unistd\.h>|<sys/mman\.h>|"eldr/readfile\.h")' src/core/*.c \
  && fail "src/core includes an I/O header (lines above)"

[ $bad = 0 ] && echo "layers: ok (base <- core <- format <- sim <- net)"
exit $bad
