#!/bin/sh
# malloc_per_request.sh — heap allocations of the router loop per request:
# runs bench_proxy with bench/malloc_count.c preloaded (it counts the
# allocations of the thread named "router"; bench_proxy prints them per
# request under each router row). glibc only.
#   bench/malloc_per_request.sh [BENCH_PROXY] [bench_proxy options]
#   e.g. bench/malloc_per_request.sh build/bench_proxy --duration 2 --conns 32
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-build/bench_proxy}
[ $# -gt 0 ] && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
${CC:-cc} -O2 -shared -fPIC -o "$tmp/malloc_count.so" "$here/malloc_count.c"
LD_PRELOAD="$tmp/malloc_count.so" "$bin" "$@"
