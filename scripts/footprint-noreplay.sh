#!/bin/sh
# footprint-noreplay.sh — footprint against its oracle without replay
# (docs/footprint.md, "Without replay"): eldr sim at 8P16D on distinct
# requests of the `realistic` generator's Llama-4 Maverick row (calibrated
# on the fitted half of the real dev trace: docs/trace.md), each served
# once, so no copy of a request is ever in flight and no replay control is
# needed. Half the generated requests fit the artifact and its priors, the
# other half are served. One CSV per seed into OUT, then the summary table
# (markdown) on stdout, for TPOT and for TPOT from prefill end.
#
# usage: scripts/footprint-noreplay.sh [OUT_DIR] [SEEDS] [REQUESTS]
#   defaults: OUT_DIR=footprint-noreplay SEEDS="1 2 ... 8" REQUESTS=3000
# env: ELDR (binary, default build/eldr), JOBS (default 2),
#      LOADS (default 0.4,0.6,0.8,0.95), SUMMARY_ONLY=1 (no runs)
set -eu
OUT=${1:-footprint-noreplay}
SEEDS=${2:-1 2 3 4 5 6 7 8}
NREQ=${3:-3000}
ELDR=${ELDR:-build/eldr}
JOBS=${JOBS:-2}
LOADS=${LOADS:-0.4,0.6,0.8,0.95}
export LOADS
HERE=$(dirname "$0")
POL=random,rr,jsq,p2c,eldr,footprint,footprint-oracle,footprint-mask
mkdir -p "$OUT"

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
  for seed in $SEEDS; do
    csv="$OUT/llama4-gen-s$seed.csv"
    [ -s "$csv" ] && continue
    echo "footprint-noreplay: seed $seed" >&2
    # twice the arrivals generated: the fit takes half, every arrival is a new request
    "$ELDR" sim --generate realistic --model llama4-maverick --gen-requests $((2 * NREQ)) --fit-fraction 0.5 \
      --prefill 8 --decode 16 --policies "$POL" --loads "$LOADS" --requests "$NREQ" --seed "$seed" \
      --jobs "$JOBS" -q --csv "$csv" >/dev/null
  done
fi

# Summary, per load (the k-th rate of each seed's sweep) and per latency:
# means over the seeds of each policy's p50 and p99, then against the best
# load balancer (the lowest of random, rr, jsq, p2c at that percentile):
# footprint's, the oracle's and eldr's change in %, footprint's and
# footprint-mask's share of the oracle's gain ("-" where the oracle gains
# less than 0.1 %), and the largest share of decode token-steps whose batch
# held another copy of the same request (0: no replay).
summary() { # metric-label p50-column p99-column
  files=
  for seed in $SEEDS; do files="$files $OUT/llama4-gen-s$seed.csv"; done
  # shellcheck disable=SC2086
  awk -F, -v label="$1" -v c50="$2" -v c99="$3" -v cx=batch_dup_frac -f "$HERE/seed-loads.awk" -f /dev/stdin $files <<'AWK'
END {
  rank_rates()
  nl = split(ENVIRON["LOADS"], loads, ",")
  for (li = 1; li <= nl; li++) {
    r = at_load(li, "footprint footprint-oracle footprint-mask eldr")
    printf "| %s | %g | %.0f | %.3f | %.3f | %+.2f / %+.2f | %+.2f / %+.2f | %s / %s | %s / %s | %+.2f / %+.2f | %.3f |\n",
      label, loads[li], r, b50, b99, g50["footprint"], g99["footprint"],
      g50["footprint-oracle"], g99["footprint-oracle"],
      sh(g50["footprint"], g50["footprint-oracle"]), sh(g99["footprint"], g99["footprint-oracle"]),
      sh(g50["footprint-mask"], g50["footprint-oracle"]), sh(g99["footprint-mask"], g99["footprint-oracle"]),
      g50["eldr"], g99["eldr"], ex_max
  }
}
AWK
}

echo "| latency | load | rate | best LB p50 (ms) | best LB p99 | footprint p50 / p99 % | oracle p50 / p99 % | share p50 / p99 | mask share p50 / p99 | eldr p50 / p99 % | replayed steps |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
summary TPOT tpot_p50_ms tpot_p99_ms
summary "TPOT from prefill end" tpot_pf_p50_ms tpot_pf_p99_ms
