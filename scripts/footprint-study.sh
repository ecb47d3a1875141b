#!/bin/sh
# footprint-study.sh — the acceptance study of the footprint policy (docs/footprint.md).
#
# eldr sim at 8P16D with --decorrelate on the real Llama-4 trace
# (../shared/traces/llama4-mmlu-dev.jsonl): fitted on a seeded half, served
# on the other half (the fit never saw a served request), at 10..95 % of
# the estimated capacity, one CSV per seed into OUT; then the summary table
# (markdown) on stdout, for TPOT and for TPOT from prefill end.
#
# usage: scripts/footprint-study.sh [OUT_DIR] [SEEDS] [REQUESTS]
#   defaults: OUT_DIR=footprint-study SEEDS="1 2 ... 12" REQUESTS=3000
# env: ELDR (binary, default build/eldr), TRACE (the Llama-4 trace), JOBS (default 2),
#      LOADS (default 0.1,0.2,0.4,0.6,0.8,0.95),
#      SUMMARY_ONLY=1 (no runs: summarise the CSVs already in OUT),
#      FP_OWN_WEIGHT (footprint's own-time weight, eldr sim --fp-own-weight; default 1),
#      FP_HOME_WEIGHT (footprint's home term, eldr sim --fp-home-weight; default 0: off)
set -eu
OUT=${1:-footprint-study}
SEEDS=${2:-1 2 3 4 5 6 7 8 9 10 11 12}
NREQ=${3:-3000}
ELDR=${ELDR:-build/eldr}
TRACE=${TRACE:-../shared/traces/llama4-mmlu-dev.jsonl}
JOBS=${JOBS:-2}
LOADS=${LOADS:-0.1,0.2,0.4,0.6,0.8,0.95}
export LOADS
HERE=$(dirname "$0")
POL=random,rr,jsq,p2c,eldr,eldr-permuted,footprint,footprint-permuted,footprint-oracle
POL=$POL,footprint-oracle-permuted,footprint-mask,footprint-mask-permuted,footprint-raw,footprint-raw-permuted
mkdir -p "$OUT"

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
  for seed in $SEEDS; do
    csv="$OUT/llama4-s$seed.csv"
    [ -s "$csv" ] && continue
    echo "footprint-study: seed $seed" >&2
    "$ELDR" sim --trace "$TRACE" --fit-fraction 0.5 --decorrelate --prefill 8 --decode 16 \
      --policies "$POL" --loads "$LOADS" --requests "$NREQ" --seed "$seed" --jobs "$JOBS" -q \
      ${FP_OWN_WEIGHT:+--fp-own-weight "$FP_OWN_WEIGHT"} ${FP_HOME_WEIGHT:+--fp-home-weight "$FP_HOME_WEIGHT"} \
      --csv "$csv" >/dev/null
  done
fi

# Summary, per load (the k-th rate of every seed's sweep) and per latency
# (TPOT; TPOT from prefill end): means over the seeds of each policy's p50
# and p99, then, against the best load balancer (the lowest of random, rr,
# jsq, p2c at that percentile):
#   fp, oracle, control   footprint's, footprint-oracle's and footprint-permuted's change, %
#   oracle control       footprint-oracle-permuted's change, % (the oracle's replay control)
#   share                 fp / oracle (the share of the oracle's gain footprint gets)
#   net share             (fp - its control) / (oracle - the oracle's control)
#   mask share            the same share for footprint-mask
#   raw share             the same share for footprint-raw (prefill profiles, no prior)
#   affinity              copies of a request routed to one decoder: footprint / its control
#   eldr, eldr net        eldr's change, and net of eldr-permuted, %
# Shares are "-" where the oracle gains less than 0.1 %.
summary() { # metric-label p50-column p99-column
  files=
  for seed in $SEEDS; do files="$files $OUT/llama4-s$seed.csv"; done
  # shellcheck disable=SC2086
  awk -F, -v label="$1" -v c50="$2" -v c99="$3" -v cx=copy_affinity -f "$HERE/seed-loads.awk" -f /dev/stdin $files <<'AWK'
END {
  rank_rates()
  nl = split(ENVIRON["LOADS"], loads, ",")
  for (li = 1; li <= nl; li++) {
    r = at_load(li, "footprint footprint-permuted footprint-oracle footprint-oracle-permuted footprint-mask footprint-mask-permuted footprint-raw footprint-raw-permuted eldr eldr-permuted")
    printf "| %s | %g | %.0f | %.3f | %.3f | %+.1f / %+.1f | %+.1f / %+.1f | %+.1f / %+.1f | %+.1f / %+.1f | %s / %s | %s / %s | %s / %s | %s / %s | %.2f / %.2f | %+.1f / %+.1f | %+.1f / %+.1f |\n",
      label, loads[li], r, b50, b99,
      g50["footprint"], g99["footprint"], g50["footprint-oracle"], g99["footprint-oracle"],
      g50["footprint-permuted"], g99["footprint-permuted"],
      g50["footprint-oracle-permuted"], g99["footprint-oracle-permuted"],
      sh(g50["footprint"], g50["footprint-oracle"]), sh(g99["footprint"], g99["footprint-oracle"]),
      sh(g50["footprint"] - g50["footprint-permuted"], g50["footprint-oracle"] - g50["footprint-oracle-permuted"]),
      sh(g99["footprint"] - g99["footprint-permuted"], g99["footprint-oracle"] - g99["footprint-oracle-permuted"]),
      sh(g50["footprint-mask"], g50["footprint-oracle"]), sh(g99["footprint-mask"], g99["footprint-oracle"]),
      sh(g50["footprint-raw"], g50["footprint-oracle"]), sh(g99["footprint-raw"], g99["footprint-oracle"]),
      EX["footprint"], EX["footprint-permuted"], g50["eldr"], g99["eldr"],
      g50["eldr"] - g50["eldr-permuted"], g99["eldr"] - g99["eldr-permuted"]
  }
}
AWK
}

echo "| latency | load | rate | best LB p50 (ms) | best LB p99 | footprint p50 / p99 % | oracle p50 / p99 % | control p50 / p99 % | oracle control p50 / p99 % | share p50 / p99 | net share p50 / p99 | mask share p50 / p99 | raw share p50 / p99 | affinity fp / control | eldr p50 / p99 % | eldr net p50 / p99 % |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
summary TPOT tpot_p50_ms tpot_p99_ms
summary "TPOT from prefill end" tpot_pf_p50_ms tpot_pf_p99_ms
