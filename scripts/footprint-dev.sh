#!/bin/sh
# footprint-dev.sh — choose footprint's own-time weight (eldr sim
# --fp-own-weight) or its home weight (--fp-home-weight, KNOB=home;
# docs/footprint.md) without reading a served request of
# the study: for each seed, the study's fit part of the Llama-4 trace (eldr
# trace split: the requests scripts/footprint-study.sh fits on) is split
# again by the same seed, fitted on one half and served on the other, for
# each weight; then, per weight, footprint's gain net of its replay control
# (percentage points against the best load balancer, TPOT, loads 0.4-0.95)
# at p50 and p99, their means, footprint's own (raw) gains' means, and the
# net shares of the oracle. Read the raw p99 beside the net one: a knob
# that makes the replay control misroute more (the home term) flatters the
# net p99 (docs/footprint.md, "The replay control, made fair").
#
# usage: scripts/footprint-dev.sh [OUT_DIR] [SEEDS] [WEIGHTS]
#   defaults: OUT_DIR=footprint-dev SEEDS="1 2 3 4 5 6" WEIGHTS="1 1.5 2 2.5 3 4"
# env: ELDR (default build/eldr), TRACE (the Llama-4 trace), JOBS (default 2),
#      REQUESTS (arrivals per run, default 3000), KNOB (own, the default, or home)
set -eu
OUT=${1:-footprint-dev}
SEEDS=${2:-1 2 3 4 5 6}
WEIGHTS=${3:-1 1.5 2 2.5 3 4}
ELDR=${ELDR:-build/eldr}
TRACE=${TRACE:-../shared/traces/llama4-mmlu-dev.jsonl}
export ELDR JOBS="${JOBS:-2}" LOADS=0.4,0.6,0.8,0.95
HERE=$(dirname "$0")
mkdir -p "$OUT"
for s in $SEEDS; do
  [ -s "$OUT/fit-$s.jsonl" ] ||
    "$ELDR" trace split "$TRACE" --fit "$OUT/fit-$s.jsonl" --held-out "$OUT/held-out-$s.jsonl" --seed "$s" -q
done
echo "| weight | net p50 points, loads 0.4 / 0.6 / 0.8 / 0.95 | mean | net p99 points | mean | raw p50 / p99 %, mean | net share of the oracle p50/p99, each load |"
echo "|---|---|---|---|---|---|---|"
KNOB=${KNOB:-own}
case $KNOB in own | home) ;; *) echo "footprint-dev: KNOB must be own or home, not '$KNOB'" >&2; exit 2 ;; esac
for w in $WEIGHTS; do
  d="$OUT/$KNOB$w"
  mkdir -p "$d"
  for s in $SEEDS; do
    [ -s "$d/llama4-s$s.csv" ] && continue
    echo "footprint-dev: $KNOB weight $w, seed $s" >&2
    if [ "$KNOB" = own ]; then export FP_OWN_WEIGHT="$w"; else export FP_HOME_WEIGHT="$w"; fi
    TRACE="$OUT/fit-$s.jsonl" "$HERE/footprint-study.sh" "$d" "$s" "${REQUESTS:-3000}" >/dev/null
  done
  # the study's TPOT rows: footprint's and its control's p50 / p99 gains
  SUMMARY_ONLY=1 "$HERE/footprint-study.sh" "$d" "$SEEDS" "${REQUESTS:-3000}" | awk -F'|' -v w="$w" '
    $2 ~ /^ TPOT $/ {
      split($7, f, "/"); split($9, c, "/"); gsub(/[ %+]/, "", f[1]); gsub(/[ %+]/, "", f[2])
      gsub(/[ %+]/, "", c[1]); gsub(/[ %+]/, "", c[2])
      p50 = p50 sep sprintf("%+.1f", f[1] - c[1]); p99 = p99 sep sprintf("%+.1f", f[2] - c[2])
      x = $12; gsub(/[ %]/, "", x)
      m50 += f[1] - c[1]; m99 += f[2] - c[2]; sh = sh ssep x; n++; sep = " / "; ssep = ", "
      r50 += f[1]; r99 += f[2]
    }
    END { printf "| %s | %s | %+.2f | %s | %+.2f | %+.2f / %+.2f | %s |\n", w, p50, m50 / n, p99, m99 / n, r50 / n, r99 / n, sh }'
done
