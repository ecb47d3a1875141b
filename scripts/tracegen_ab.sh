#!/usr/bin/env bash
# Old vs new `eldr trace gen`, alternately (A B A B), for a speed change that
# must keep the output: user CPU of each run and the md5 of its bytes, for
# three shapes (task, realistic, task --form counts). Ratios within one run
# are what to compare; absolute seconds depend on the machine's load.
# Usage: scripts/tracegen_ab.sh OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]
#        (defaults 10000 and 128: 10k x 128 writes 2.5 GB per run to a pipe)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]" >&2; exit 2; }
OLD=$1 NEW=$2 N=${3:-10000} T=${4:-128}
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "tracegen_ab: $b is not executable" >&2; exit 2; }; done
TIMES=$(mktemp)
trap 'rm -f "$TIMES"' EXIT
status=0
for shape in "-w task" "-w realistic" "-w task --form counts"; do
  sums=()
  line="[$shape] user s (old new old new):"
  for b in "$OLD" "$NEW" "$OLD" "$NEW"; do
    # shellcheck disable=SC2086 # shape is a list of flags
    sum=$( { /usr/bin/time -f %U -o "$TIMES" "$b" trace gen -n "$N" --decode-tokens "$T" $shape \
             -j 1 -q -o - | md5sum | cut -c1-32; } )
    line="$line $(cat "$TIMES")"
    sums+=("$sum")
  done
  echo "$line  md5 ${sums[0]}"
  for s in "${sums[@]}"; do
    [ "$s" = "${sums[0]}" ] || { echo "  DIFFERENT OUTPUT: ${sums[*]}"; status=1; break; }
  done
done
exit $status
