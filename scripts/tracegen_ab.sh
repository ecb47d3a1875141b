#!/usr/bin/env bash
# Old vs new `eldr trace gen`, alternately (A B A B): user + system CPU
# seconds of each run at -j 1 (one generator thread; the writer is the main
# thread) and the md5 of its bytes. Ratios within one run are what to
# compare; absolute seconds depend on the machine's load.
# Usage: scripts/tracegen_ab.sh OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]
#        (defaults 10000 and 128: 10k x 128 writes 2.5 GB per run to a pipe)
# Environment: TRACEGEN_AB_SHAPES   ';'-separated flag lists, one line each
#                                   [-w task;-w realistic;-w task --form counts]
#              TRACEGEN_AB_NEW_STREAM=1  old and new may differ (a change of
#                                   the random stream); else a difference fails
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]" >&2; exit 2; }
OLD=$1 NEW=$2 N=${3:-10000} T=${4:-128}
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "tracegen_ab: $b is not executable" >&2; exit 2; }; done
IFS=';' read -r -a SHAPES <<<"${TRACEGEN_AB_SHAPES:--w task;-w realistic;-w task --form counts}"
TIMES=$(mktemp)
trap 'rm -f "$TIMES"' EXIT
status=0
for shape in "${SHAPES[@]}"; do
  sums=()
  line="[$shape] user+sys s (old new old new):"
  for b in "$OLD" "$NEW" "$OLD" "$NEW"; do
    # shellcheck disable=SC2086 # shape is a list of flags
    sum=$( { /usr/bin/time -f '%U %S' -o "$TIMES" "$b" trace gen -n "$N" --decode-tokens "$T" $shape \
             -j 1 -q -o - | md5sum | cut -c1-32; } )
    line="$line $(awk '{printf "%.2f", $1 + $2}' "$TIMES")"
    sums+=("$sum")
  done
  echo "$line  md5 old ${sums[0]} new ${sums[1]}"
  [ "${sums[0]}" = "${sums[2]}" ] && [ "${sums[1]}" = "${sums[3]}" ] ||
    { echo "  NOT DETERMINISTIC: ${sums[*]}"; status=1; }
  if [ "${TRACEGEN_AB_NEW_STREAM:-0}" != 1 ] && [ "${sums[0]}" != "${sums[1]}" ]; then
    echo "  DIFFERENT OUTPUT (set TRACEGEN_AB_NEW_STREAM=1 for a change of the stream)"
    status=1
  fi
done
exit $status
