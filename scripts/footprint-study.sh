#!/bin/sh
# footprint-study.sh — the acceptance study of the footprint policy (docs/footprint.md).
#
# eldr sim at 8P16D with --decorrelate, fitting on one seeded part and serving
# requests the fit never saw, on three workloads:
#   llama4    held-out real Llama-4 (../shared/traces/llama4-mmlu-dev.jsonl, seeded 50 % split)
#   task      generated task workload, qwen3-30b-a3b on mi300x (3000 generated, fit on 33 %)
#   language  generated language workload, same
# each at the default 20..95 % load sweep and at the paper's 20..100 req/s.
# Writes one CSV per (workload, sweep, seed) into OUT and prints the summary
# table (markdown) on stdout.
#
# usage: scripts/footprint-study.sh [OUT_DIR] [SEEDS] [REQUESTS]
#   defaults: OUT_DIR=footprint-study SEEDS="1" REQUESTS=3000
# env: ELDR (binary, default build/eldr), TRACE (the Llama-4 trace), JOBS (default 2),
#      SUMMARY_ONLY=1 (no runs: summarise the CSVs already in OUT)
set -eu
OUT=${1:-footprint-study}
SEEDS=${2:-1}
NREQ=${3:-3000}
ELDR=${ELDR:-build/eldr}
TRACE=${TRACE:-../shared/traces/llama4-mmlu-dev.jsonl}
JOBS=${JOBS:-2}
POL=random,rr,jsq,p2c,eldr,eldr-permuted,footprint,footprint-permuted,footprint-oracle,footprint-mask
mkdir -p "$OUT"

run() { # name sweep seed args...
  name=$1; sweep=$2; seed=$3; shift 3
  csv="$OUT/$name-$sweep-s$seed.csv"
  if [ "$sweep" = paper ]; then rates="--rates 20,40,60,80,100"; else rates=""; fi
  if [ ! -s "$csv" ]; then
    # shellcheck disable=SC2086
    "$ELDR" sim "$@" --decorrelate --prefill 8 --decode 16 --policies "$POL" --seed "$seed" \
      --jobs "$JOBS" -q $rates --csv "$csv" >/dev/null
  fi
}

[ "${SUMMARY_ONLY:-0}" = 1 ] && SEEDS=""
for seed in $SEEDS; do
  for sweep in load paper; do
    if [ -r "$TRACE" ]; then
      run llama4 $sweep "$seed" --trace "$TRACE" --fit-fraction 0.5 --requests "$NREQ"
    fi
    for w in task language; do
      run $w $sweep "$seed" --generate $w --model qwen3-30b-a3b --hardware mi300x \
        --gen-requests 3000 --fit-fraction 0.33 --requests "$NREQ"
    done
  done
done

# Summary: per workload, sweep and rate (mean over seeds of each policy's
# numbers): the best load balancer (lowest p50 among random/rr/jsq/p2c, and
# lowest p99 separately), eldr (tau 0.1), footprint, its controls, and
#   fp-LB p50/p99 %  footprint vs the best load balancer (negative = better)
#   net %            (footprint - footprint-permuted) / best LB p50: the gain
#                    that survives the replay control
#   fp-eldr pts      footprint p50 minus eldr p50, in % of the best LB p50
#   oracle share     (LB - footprint) / (LB - oracle) at p50
#   TTFT vs jsq %    footprint TTFT p50 vs JSQ's
echo "| workload | sweep | rate | best LB p50 (ms) | best LB p99 | eldr p50 | footprint p50 | footprint p99 | fp-LB p50 % | fp-LB p99 % | net of replay % | fp-eldr pts | oracle p50 | oracle share | mask p50 | TTFT vs jsq % |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for f in "$OUT"/*.csv; do
  b=$(basename "$f" .csv)
  echo "$b" | sed 's/-s[0-9]*$//' | sed 's/-\(load\|paper\)$/ \1/'
done | sort -u | while read -r name sweep; do
  cat "$OUT/$name-$sweep"-s*.csv | awk -F, -v name="$name" -v sweep="$sweep" '
    $1 == "policy" { next }
    { k = $1 SUBSEP $2; p50[k] += $3; p99[k] += $4; tt[k] += $6; n[k]++
      if (!($2 in seen)) { seen[$2] = 1; rates[++nr] = $2 } }
    END {
      for (i = 1; i <= nr; i++) {
        r = rates[i]; b50 = -1; b99 = -1
        split("random rr jsq p2c", lbs, " ")
        for (j = 1; j <= 4; j++) { k = lbs[j] SUBSEP r; if (!(k in n)) continue
          x = p50[k] / n[k]; y = p99[k] / n[k]
          if (b50 < 0 || x < b50) { b50 = x; l50 = lbs[j] }
          if (b99 < 0 || y < b99) { b99 = y; l99 = lbs[j] } }
        fk = "footprint" SUBSEP r; ek = "eldr" SUBSEP r; ok = "footprint-oracle" SUBSEP r
        pk = "footprint-permuted" SUBSEP r; mk = "footprint-mask" SUBSEP r; jk = "jsq" SUBSEP r
        f50 = p50[fk] / n[fk]; f99 = p99[fk] / n[fk]; e50 = p50[ek] / n[ek]; o50 = p50[ok] / n[ok]
        pp50 = p50[pk] / n[pk]; m50 = p50[mk] / n[mk]
        share = (b50 - o50) > 1e-9 ? sprintf("%.0f%%", 100 * (b50 - f50) / (b50 - o50)) : "n/a"
        printf "| %s | %s | %g | %.3f (%s) | %.3f (%s) | %.3f | %.3f | %.3f | %+.1f | %+.1f | %+.1f | %+.1f | %.3f | %s | %.3f | %+.1f |\n",
          name, sweep, r, b50, l50, b99, l99, e50, f50, f99, 100 * (f50 / b50 - 1), 100 * (f99 / b99 - 1),
          100 * (f50 - pp50) / b50, 100 * (f50 - e50) / b50, o50, share, m50,
          100 * ((tt[fk] / n[fk]) / (tt[jk] / n[jk]) - 1)
      }
    }'
done
