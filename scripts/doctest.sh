#!/usr/bin/env bash
# Docs as tests: run every command shown in README.md and docs/*.md, and check
# every link between those pages.
#
# Usage: scripts/doctest.sh [build-dir]        (default: build; needs build/eldr)
#        ELDR_DOCTEST_PAGES="docs/fit.md docs/trace.md" scripts/doctest.sh
#        ELDR_DOCTEST_KEEP=1 keeps the scratch directory and prints its path.
#
# What runs: the lines of every fenced block opened with ```sh. Blocks opened
# with a bare ``` (or ```json, ...) are output or formats and are never run.
# The blocks of one page run in order, in one scratch directory of their own
# (so a later block can use a file an earlier one wrote), with the build's
# eldr first on PATH. The scratch directory holds links to the worktree's
# top-level entries (scripts/, docs/, ...), `build` (the build dir) and
# ../shared (the real traces and corpus), so commands read as in a checkout.
# A block runs as one `bash -eo pipefail` script: it fails the run on a
# non-zero exit, a timeout, or a marker's check.
#
# Markers: HTML comments (invisible on the rendered page) on the lines right
# before the opening fence, one per line:
#   <!-- doctest: skip: REASON -->      do not run this block; REASON is printed
#                                       (e.g. needs a real vLLM cluster)
#   <!-- doctest: sub 'SED-EXPR' -->    apply a sed expression to the block before
#                                       running it: cheaper inputs for CI, e.g.
#                                       sub 's/--requests 5000/--requests 300/'
#   <!-- doctest: expect-file NAME -->  NAME exists and is not empty afterwards
#   <!-- doctest: expect-output 'TEXT' -->  stdout+stderr contain TEXT (a fixed
#                                       string: a number the page quotes)
#   <!-- doctest: setup 'COMMAND' -->  run COMMAND first (not shown on the page):
#                                       inputs a page names but does not make,
#                                       e.g. setup 'eldr trace gen -n 200 -q -o t.jsonl'
#   <!-- doctest: exit N -->            the block must exit with status N (an
#                                       error the page documents)
#   <!-- doctest: timeout SECONDS -->   limit for this block [120]
# Several sub/expect markers may precede one block; quotes are single quotes.
#
# Links: every [text](target) outside code in those pages whose target is not
# a URL must name an existing file, and a #anchor must name a heading of the
# target page (GitHub's slugs: lower case, punctuation dropped, spaces to -).
#
# Prints one line per block and, at the end, the number of commands run,
# blocks run and skipped, pages covered and links checked.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
[ -x "$BUILD/eldr" ] || { echo "doctest: $BUILD/eldr not built" >&2; exit 2; }
PAGES=${ELDR_DOCTEST_PAGES:-"README.md $(ls docs/*.md)"}
export LC_ALL=C

SCRATCH=$(mktemp -d /tmp/eldr-doctest-XXXXXX)
cleanup() { if [ -n "${ELDR_DOCTEST_KEEP:-}" ]; then echo "doctest: kept $SCRATCH"; else rm -rf "$SCRATCH"; fi; }
trap cleanup EXIT
if [ -d "$ROOT/../shared" ]; then ln -s "$(cd "$ROOT/../shared" && pwd)" "$SCRATCH/shared"; fi

failures=0 commands=0 run_blocks=0 skipped=0 pages=0 links=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# --- extraction: page -> $dir/NNN.sh (block), NNN.mk (markers), NNN.line ---
extract() { # page outdir
  awk -v out="$2" '
    function flush_markers() { nm = 0 }
    BEGIN { n = 0; inblk = 0; infence = 0; nm = 0 }
    {
      if (inblk) {
        if ($0 ~ /^[ \t]*```[ \t]*$/) { inblk = 0; close(f); next }
        print > f; next
      }
      if (infence) { if ($0 ~ /^[ \t]*```/) infence = 0; next }
      if ($0 ~ /^[ \t]*<!-- doctest:.*-->[ \t]*$/) {
        m = $0; sub(/^[ \t]*<!-- doctest:[ \t]*/, "", m); sub(/[ \t]*-->[ \t]*$/, "", m)
        mk[++nm] = m; next
      }
      if ($0 ~ /^[ \t]*```sh[ \t]*$/) {
        n++; base = sprintf("%s/%03d", out, n); f = base ".sh"
        printf "" > f
        mf = base ".mk"; printf "" > mf
        for (i = 1; i <= nm; i++) print mk[i] > mf
        close(mf)
        print NR > (base ".line"); close(base ".line")
        nm = 0; inblk = 1; next
      }
      if ($0 ~ /^[ \t]*```/) { infence = 1; nm = 0; next }
      if ($0 !~ /^[ \t]*$/) nm = 0
    }
    END { if (inblk) { print "unterminated ```sh block" > "/dev/stderr"; exit 1 } }
  ' "$1"
}

# Logical commands in a block: non-blank, non-comment lines, continuations joined.
count_commands() {
  awk '{ if (cont) { cont = ($0 ~ /\\$/); next } }
       /^[ \t]*(#|$)/ { next }
       { n++; cont = ($0 ~ /\\$/) }
       END { print n + 0 }' "$1"
}

# Strip one level of single quotes: 'abc' -> abc.
unquote() { local s=$1; s=${s#\'}; s=${s%\'}; printf '%s' "$s"; }

run_page() { # page
  local page=$1 name dir blocks b
  name=$(echo "$page" | tr '/.' '__')
  dir="$SCRATCH/$name"; blocks="$SCRATCH/.blocks-$name"
  mkdir -p "$dir" "$blocks"
  for e in "$ROOT"/*; do
    case "$(basename "$e")" in build*) continue ;; esac
    ln -s "$e" "$dir/$(basename "$e")"
  done
  ln -s "$BUILD" "$dir/build"
  if ! extract "$page" "$blocks"; then fail "$page: cannot extract blocks"; return; fi
  pages=$((pages + 1))
  for b in "$blocks"/*.sh; do
    [ -e "$b" ] || continue
    local line skip="" expect_exit=0 limit=120 files=() outs=() subs=() setups=() m
    line=$(cat "${b%.sh}.line")
    while IFS= read -r m; do
      case "$m" in
        skip:*) skip=${m#skip:}; skip=${skip# } ;;
        sub\ *) subs+=("$(unquote "${m#sub }")") ;;
        setup\ *) setups+=("$(unquote "${m#setup }")") ;;
        expect-file\ *) files+=("${m#expect-file }") ;;
        expect-output\ *) outs+=("$(unquote "${m#expect-output }")") ;;
        exit\ *) expect_exit=${m#exit } ;;
        timeout\ *) limit=${m#timeout } ;;
        *) fail "$page:$line: unknown marker '$m'"; continue 2 ;;
      esac
    done < "${b%.sh}.mk"
    if [ -n "$skip" ]; then
      echo "skip $page:$line ($skip)"; skipped=$((skipped + 1)); continue
    fi
    local script="${b%.sh}.run" s
    cp "$b" "$script"
    for s in "${subs[@]+"${subs[@]}"}"; do sed -i -e "$s" "$script"; done
    if [ "${#setups[@]}" -gt 0 ]; then
      { printf '%s\n' "${setups[@]}"; cat "$script"; } > "$script.tmp" && mv "$script.tmp" "$script"
    fi
    if grep -q '\.\./shared' "$script" && [ ! -e "$SCRATCH/shared" ]; then
      echo "skip $page:$line (no ../shared next to the worktree)"; skipped=$((skipped + 1)); continue
    fi
    local n t0 rc log="${b%.sh}.log"
    n=$(count_commands "$script")
    t0=$(date +%s)
    (cd "$dir" && PATH="$BUILD:$PATH" timeout -k 5 "$limit" bash -eo pipefail "$script") > "$log" 2>&1
    rc=$?
    commands=$((commands + n)); run_blocks=$((run_blocks + 1))
    local bad=""
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then bad="timed out after ${limit}s"
    elif [ "$rc" != "$expect_exit" ]; then bad="exit $rc (expected $expect_exit)"; fi
    for s in "${files[@]+"${files[@]}"}"; do
      [ -s "$dir/$s" ] || bad="$bad${bad:+; }file '$s' not written"
    done
    for s in "${outs[@]+"${outs[@]}"}"; do
      grep -qF -- "$s" "$log" || bad="$bad${bad:+; }output lacks '$s'"
    done
    if [ -n "$bad" ]; then
      fail "$page:$line: $bad"; sed 's/^/    | /' "$script"; tail -n 15 "$log" | sed 's/^/    > /'
    else
      echo "ok   $page:$line ($n commands, $(( $(date +%s) - t0 ))s)"
    fi
  done
}

# GitHub heading slugs of a page, one per line.
slugs() {
  awk 'BEGIN { infence = 0 }
       /^[ \t]*```/ { infence = !infence; next }
       infence { next }
       /^#+[ \t]/ {
         h = $0; sub(/^#+[ \t]+/, "", h); h = tolower(h)
         gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h)
         if (seen[h]++) h = h "-" (seen[h] - 1)
         print h
       }' "$1"
}

check_links() { # page
  local page=$1 dirn target path anchor resolved
  dirn=$(dirname "$page")
  while IFS= read -r target; do
    links=$((links + 1))
    path=${target%%#*}; anchor=""
    case "$target" in *#*) anchor=${target#*#} ;; esac
    if [ -z "$path" ]; then resolved=$page; else resolved="$dirn/$path"; fi
    if [ ! -e "$resolved" ]; then fail "$page: link ($target): $resolved does not exist"; continue; fi
    if [ -n "$anchor" ] && [ -f "$resolved" ]; then
      slugs "$resolved" | grep -qxF -- "$anchor" || fail "$page: link ($target): no heading #$anchor in $resolved"
    fi
  done < <(awk 'BEGIN { infence = 0 }
                /^[ \t]*```/ { infence = !infence; next }
                infence || /^    / { next }
                { line = $0; gsub(/`[^`]*`/, "", line)
                  while (match(line, /\]\([^) ]+\)/)) {
                    print substr(line, RSTART + 2, RLENGTH - 3); line = substr(line, RSTART + RLENGTH)
                  } }' "$page" | grep -vE '^(https?|mailto|ftp):')
}

start=$(date +%s)
for page in $PAGES; do
  check_links "$page"
  run_page "$page"
done
echo "doctest: $commands commands in $run_blocks blocks run, $skipped blocks skipped," \
  "$pages pages covered, $links links checked, $failures failures, $(( $(date +%s) - start ))s"
[ "$failures" = 0 ]
