#!/bin/sh
# ep-study.sh — the expert-parallelism study of docs/sim.md ("Expert
# parallelism"): ELDR against the best load balancer on 2P8D clusters whose
# decoders run TP x EP, with the linear (engine default), global and
# per-decoder expert placements, on generated task and language workloads.
#
#   scripts/ep-study.sh [OUTDIR]          # all runs, then the summary
#   scripts/ep-study.sh OUTDIR summary    # only re-print the summary
#
# Knobs (environment): ELDR (binary, build/eldr), GEN (generated requests per
# workload, 900), FIT (fit fraction, 0.33: the served pool is ~600 requests,
# each served about once, so no replayed copies), REQ (arrivals per run,
# 600), JOBS (sim threads, 2), HW (hardware preset, mi300x), SENS (1: also the
# all-to-all / rank-bandwidth sensitivity runs), REAL (the real Llama-4
# trace, default ../shared/traces/llama4-mmlu-dev.jsonl: run when present).
# Sizes are small on purpose: the numbers in docs/sim.md come from a shared
# 2-core machine.
set -eu
ELDR=${ELDR:-build/eldr}
OUT=${1:-ep-study}
GEN=${GEN:-900}
FIT=${FIT:-0.33}
REQ=${REQ:-600}
JOBS=${JOBS:-2}
HW=${HW:-mi300x}
SENS=${SENS:-1}
REAL=${REAL:-../shared/traces/llama4-mmlu-dev.jsonl}
POL=random,rr,jsq,p2c,eldr
mkdir -p "$OUT"

run() { # name model tp ep workload placement [extra sim args...]
  name=$1 model=$2 tp=$3 ep=$4 w=$5 pl=$6
  shift 6
  if [ -s "$OUT/$name.json" ]; then return 0; fi
  echo "ep-study: $name" >&2
  "$ELDR" sim --generate "$w" --model "$model" --hardware "$HW" --gen-requests "$GEN" \
    --fit-fraction "$FIT" --requests "$REQ" --prefill 2 --decode 8 --tp "$tp" --ep-size "$ep" \
    --placement "$pl" --policies "$POL" --jobs "$JOBS" --seed 1 --json -q "$@" >"$OUT/$name.json.tmp"
  mv "$OUT/$name.json.tmp" "$OUT/$name.json"
}

if [ "${2:-}" != summary ]; then
  for w in task language; do
    for pl in linear global per-decoder; do
      run "qwen3-235b-tp4ep4-$w-$pl" qwen3-235b-a22b 4 4 "$w" "$pl"
    done
  done
  for w in task language; do
    for pl in linear global per-decoder; do
      run "deepseek-v3-tp8ep8-$w-$pl" deepseek-v3 8 8 "$w" "$pl"
    done
  done
  if [ "$SENS" = 1 ]; then
    # uncertainty: all-to-all fixed cost x0.25 and x4 (15 us -> 3.75 / 60 us),
    # rank HBM bandwidth x0.5 (MI300X: 5.3 TB/s x 0.8 -> 2.12 TB/s)
    printf '{"a2a_latency_s": 3.75e-6}\n' >"$OUT/a2a-low.json"
    printf '{"a2a_latency_s": 60e-6}\n' >"$OUT/a2a-high.json"
    printf '{"rank_hbm_bw": 2.12e12}\n' >"$OUT/bw-half.json"
    for s in a2a-low a2a-high bw-half; do
      for pl in linear global per-decoder; do
        run "sens-$s-qwen3-235b-tp4ep4-task-$pl" qwen3-235b-a22b 4 4 task "$pl" --latency "$OUT/$s.json"
      done
    done
  fi
  if [ -r "$REAL" ]; then
    # the real Llama-4-Maverick trace (top-1, 24 MoE layers) on TP8 EP8 H200
    # decoders; decorrelated (the pool is ~130 requests, see "replay artifact")
    for pl in linear global per-decoder; do
      name="llama4-real-tp8ep8-mmlu-$pl"
      if [ ! -s "$OUT/$name.json" ]; then
        echo "ep-study: $name" >&2
        "$ELDR" sim --trace "$REAL" --prefill 2 --decode 8 --ep-size 8 --placement "$pl" \
          --policies "$POL" --decorrelate --requests 3000 --jobs "$JOBS" --seed 1 --json -q \
          >"$OUT/$name.json.tmp"
        mv "$OUT/$name.json.tmp" "$OUT/$name.json"
      fi
    done
  fi
fi
python3 "$(dirname "$0")/ep-study-summary.py" "$OUT"
