#!/usr/bin/env bash
# Old vs new `eldr trace gen`, alternately (A B A B ...): the median wall,
# user and system seconds of each, and whether their bytes are the same.
# Ratios within one run are what to compare; absolute seconds depend on the
# machine's load.
# Usage: scripts/tracegen_ab.sh OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]
#        (defaults 10000 and 128: 10k x 128 writes 2.5 GB per run)
# Environment: TRACEGEN_AB_SHAPES   ';'-separated flag lists, one line each
#                                   [-w task;-w realistic;-w task --form counts]
#              TRACEGEN_AB_JOBS     generator threads (-j) [1]
#              TRACEGEN_AB_SINK     pipe: -o - into /dev/null (default);
#                                   file: -o a file in TRACEGEN_AB_DIR [/tmp],
#                                   removed before each run (the timing does
#                                   not include unlinking the last run's file)
#              TRACEGEN_AB_REPS     runs of each [2]
#              TRACEGEN_AB_CHECK_N  requests of the byte check [1000]: each
#                                   binary to a pipe and to a file (at -j 1
#                                   and at 3 threads), md5 compared
#              TRACEGEN_AB_NEW_STREAM=1  old and new may differ (a change of
#                                   the random stream); else a difference fails
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_ELDR NEW_ELDR [REQUESTS] [DECODE_TOKENS]" >&2; exit 2; }
OLD=$1 NEW=$2 N=${3:-10000} T=${4:-128}
JOBS=${TRACEGEN_AB_JOBS:-1} SINK=${TRACEGEN_AB_SINK:-pipe} REPS=${TRACEGEN_AB_REPS:-2}
CN=${TRACEGEN_AB_CHECK_N:-1000} DIR=${TRACEGEN_AB_DIR:-/tmp}
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "tracegen_ab: $b is not executable" >&2; exit 2; }; done
case $SINK in pipe | file) ;; *) echo "tracegen_ab: TRACEGEN_AB_SINK is pipe or file" >&2; exit 2 ;; esac
IFS=';' read -r -a SHAPES <<<"${TRACEGEN_AB_SHAPES:--w task;-w realistic;-w task --form counts}"
TIMES=$(mktemp)
OUT="$DIR/tracegen_ab.$$.jsonl"
trap 'rm -f "$TIMES" "$TIMES.old" "$TIMES.new" "$OUT"' EXIT
status=0

median() { sort -g | awk '{v[NR] = $1} END {printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# md5 of one run's bytes: binary, flags (word-split on purpose), sink, jobs
bytes_of() {
  # shellcheck disable=SC2086
  if [ "$3" = pipe ]; then
    "$1" trace gen -n "$CN" --decode-tokens "$T" $2 -j "$4" -q -o - | md5sum | cut -c1-32
  else
    "$1" trace gen -n "$CN" --decode-tokens "$T" $2 -j "$4" -q -o "$OUT" && md5sum <"$OUT" | cut -c1-32
  fi
}

for shape in "${SHAPES[@]}"; do
  sums=()
  for b in "$OLD" "$NEW"; do
    for s in pipe file; do for j in 1 3; do sums+=("$(bytes_of "$b" "$shape" $s $j)"); done; done
  done
  uniq_old=$(printf '%s\n' "${sums[@]:0:4}" | sort -u | wc -l)
  uniq_new=$(printf '%s\n' "${sums[@]:4:4}" | sort -u | wc -l)
  [ "$uniq_old" = 1 ] && [ "$uniq_new" = 1 ] ||
    { echo "[$shape] BYTES DEPEND ON THE SINK OR -j: ${sums[*]}"; status=1; }
  if [ "${TRACEGEN_AB_NEW_STREAM:-0}" != 1 ] && [ "${sums[0]}" != "${sums[4]}" ]; then
    echo "[$shape] DIFFERENT OUTPUT old ${sums[0]} new ${sums[4]} (TRACEGEN_AB_NEW_STREAM=1 for a change of the stream)"
    status=1
  fi
  : >"$TIMES.old"
  : >"$TIMES.new"
  for ((r = 0; r < REPS; r++)); do
    for which in old new; do
      b=$OLD
      [ $which = new ] && b=$NEW
      rm -f "$OUT"
      dest=-
      [ "$SINK" = file ] && dest=$OUT
      # shellcheck disable=SC2086 # shape is a list of flags
      /usr/bin/time -f '%e %U %S' -o "$TIMES" "$b" trace gen -n "$N" --decode-tokens "$T" $shape \
        -j "$JOBS" -q -o "$dest" >/dev/null
      cat "$TIMES" >>"$TIMES.$which"
    done
  done
  rm -f "$OUT"
  line="[$shape] -n $N --decode-tokens $T -j $JOBS to a $SINK, median of $REPS (old / new):"
  for f in 1 2 3; do
    name=$(echo "wall user sys" | cut -d' ' -f$f)
    o=$(cut -d' ' -f$f "$TIMES.old" | median)
    n=$(cut -d' ' -f$f "$TIMES.new" | median)
    line="$line $name $o / $n"
  done
  echo "$line  (md5 old ${sums[0]} new ${sums[4]})"
  rm -f "$TIMES.old" "$TIMES.new"
done
exit $status
