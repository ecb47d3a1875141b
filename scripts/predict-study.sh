#!/bin/sh
# predict-study.sh — the acceptance studies of the decoder chosen before the
# prefill ends (issue 25; docs/sglang.md "What a prediction keeps").
#
# (i) prefix: the real Llama-4 trace (../shared/traces/llama4-mmlu-dev.jsonl),
#     fitted on a seeded half (eldr fit --fit-fraction 0.5 --seed S), the
#     other half served (eldr sim --artifact --fit-fraction 0.5 --seed S,
#     --decorrelate, 8P16D): rho of the signatures of the first f of each
#     prompt (eldr rho --known-fraction f on the held-out part) and the
#     simulated TPOT p50/p99 change of eldr and footprint against the best
#     load balancer (random rr jsq p2c), net of each one's replay control
#     (eldr-permuted, footprint-permuted), when the decision knows only the
#     first f (--known-fraction f --predict-threshold 0), f = 0 .. 1, and
#     with the full prefill signature ("full").
# (ii) mooncake: the Mooncake conversation structure (the first MC_REQUESTS
#     lines of ../shared/traces/mooncake-conversation-dev.jsonl, output
#     capped at MC_DECODE tokens), each distinct block's experts drawn once
#     from the model's realistic generator, 8P16D, qwen3-235b-a22b and
#     deepseek-v3, the default load sweep (20..95 % of the estimated
#     capacity) with the trace's arrivals in order scaled to each rate,
#     --pd vllm,sglang,sglang-exact, the artifact fitted on GEN_REQUESTS
#     requests of the same generator (other request indices), SEEDS seeds.
#
# usage: scripts/predict-study.sh [OUT_DIR] [SEEDS]
#   defaults: OUT_DIR=predict-study SEEDS="1 2 3"
# env: ELDR (binary, default build/eldr), JOBS (2), PARTS ("prefix mooncake"),
#      NREQ (arrivals per prefix run, 3000), LOADS_PREFIX (0.6,0.9),
#      MC_REQUESTS (300), MC_DECODE (128), GEN_REQUESTS (300), REGISTER_MS (2),
#      MODELS ("qwen3-235b-a22b deepseek-v3"), PREFILL (8), DECODE (16) (part ii),
#      SUMMARY_ONLY=1 (summarise OUT)
set -eu
OUT=${1:-predict-study}
SEEDS=${2:-1 2 3}
ELDR=${ELDR:-build/eldr}
JOBS=${JOBS:-2}
PARTS=${PARTS:-prefix mooncake}
NREQ=${NREQ:-3000}
LOADS_PREFIX=${LOADS_PREFIX:-0.6,0.9}
MC_REQUESTS=${MC_REQUESTS:-300}
MC_DECODE=${MC_DECODE:-128}
GEN_REQUESTS=${GEN_REQUESTS:-300}
REGISTER_MS=${REGISTER_MS:-2}
MODELS=${MODELS:-qwen3-235b-a22b deepseek-v3}
PREFILL=${PREFILL:-8}
DECODE=${DECODE:-16}
LLAMA=${LLAMA:-../shared/traces/llama4-mmlu-dev.jsonl}
MOONCAKE=${MOONCAKE:-../shared/traces/mooncake-conversation-dev.jsonl}
FRACS="0 0.25 0.5 0.75 1"
mkdir -p "$OUT"

# the sim's JSON cut to the fields the summary reads (what docs/ keeps)
cut_json() { # in out
  python3 - "$1" "$2" <<'JSEOF'
import json, sys
j = json.load(open(sys.argv[1]))
rows = ["policy", "rate", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "mean_batch", "mean_union",
        "predicted_share", "confidence_mean", "pd"]
cfg = ["prefill", "decode", "register_ms", "mooncake", "mooncake_blocks", "known_fraction", "predict_threshold",
       "seed", "requests"]
o = {"config": {k: j["config"][k] for k in cfg if k in j["config"]},
     "rows": [{k: r[k] for k in rows if k in r} for r in j["rows"]]}
with open(sys.argv[2], "w") as f:
    json.dump(o, f, separators=(",", ":"))
    f.write("\n")
JSEOF
  rm -f "$1"
}

if [ "${SUMMARY_ONLY:-0}" != 1 ]; then
  for part in $PARTS; do
    for seed in $SEEDS; do
      if [ "$part" = prefix ]; then
        art="$OUT/llama4-art-s$seed.json"
        [ -s "$art" ] || "$ELDR" fit --trace "$LLAMA" --decoders 16 --fit-fraction 0.5 --seed "$seed" \
          --model llama4-maverick --hardware h200 -o "$art" -q >/dev/null
        [ -s "$OUT/llama4-ho-s$seed.jsonl" ] || "$ELDR" trace split "$LLAMA" --fit "$OUT/llama4-fit-s$seed.jsonl" \
          --held-out "$OUT/llama4-ho-s$seed.jsonl" --seed "$seed" -q
        for f in full $FRACS; do
          js="$OUT/prefix-s$seed-f$f.json"
          [ -s "$js" ] && continue
          echo "predict-study: prefix seed $seed f $f" >&2
          if [ "$f" = full ]; then kf=""; rk=""; else kf="--known-fraction $f --predict-threshold 0"; rk="--known-fraction $f"; fi
          # f = 0: nothing known, every signature empty: no rho
          if [ "$f" = 0 ]; then echo '{"rho": null}' >"$OUT/rho-s$seed-f$f.json"; else
          # shellcheck disable=SC2086
          "$ELDR" rho --trace "$OUT/llama4-ho-s$seed.jsonl" --artifact "$art" $rk --json >"$OUT/rho-s$seed-f$f.json"; fi
          # shellcheck disable=SC2086
          "$ELDR" sim --trace "$LLAMA" --artifact "$art" --fit-fraction 0.5 --seed "$seed" --decorrelate \
            --prefill 8 --decode 16 --policies random,rr,jsq,p2c,eldr,eldr-permuted,footprint,footprint-permuted \
            --loads "$LOADS_PREFIX" --requests "$NREQ" --jobs "$JOBS" -q $kf --json >"$js.tmp" 2>"$OUT/prefix-s$seed-f$f.err"
          cut_json "$js.tmp" "$js"
        done
      else
        for model in $MODELS; do
          js="$OUT/mooncake-$model-s$seed.json"
          [ -s "$js" ] && continue
          echo "predict-study: mooncake $model seed $seed" >&2
          "$ELDR" sim --generate realistic --gen-requests "$GEN_REQUESTS" --model "$model" --seed "$seed" \
            --serve-mooncake "$MOONCAKE" --mooncake-requests "$MC_REQUESTS" --max-decode-tokens "$MC_DECODE" \
            --arrivals scaled --prefill "$PREFILL" --decode "$DECODE" --policies random,rr,jsq,p2c,footprint,footprint-permuted \
            --pd vllm,sglang,sglang-exact --register-ms "$REGISTER_MS" --jobs "$JOBS" -q --json >"$js.tmp"
          cut_json "$js.tmp" "$js"
        done
      fi
    done
  done
fi

exec python3 - "$OUT" "$FRACS" "$MC_REQUESTS" "$MC_DECODE" <<'EOF'
import glob, json, os, statistics, sys
out, fracs, mc_n = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
LB = ["random", "rr", "jsq", "p2c"]
mean = statistics.mean

def rows_by(js):
    return {(r["policy"], round(r["rate"], 6)): r for r in js["rows"]}

def loads(js):
    return sorted({round(r["rate"], 6) for r in js["rows"]})

def change(x, b):
    return 100.0 * (x / b - 1.0)

def best(rows, rate, key, suffix=""):
    return min(rows[(p + suffix, rate)][key] for p in LB)

files = sorted(glob.glob(os.path.join(out, "prefix-s*-ffull.json")))
if files:
    seeds = [f.split("-s")[-1].split("-f")[0] for f in files]
    print("(i) Llama-4 MMLU dev, held-out half, 8P16D, decorrelated; change vs the best load balancer, "
          "net of the replay control (percentage points; negative = faster), mean of seeds " + " ".join(seeds))
    print()
    print("| known | rho | load | eldr p50 | eldr p99 | footprint p50 | footprint p99 | on a prediction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for f in ["full"] + fracs:
        rv = [json.load(open(os.path.join(out, "rho-s%s-f%s.json" % (s, f))))["rho"] for s in seeds]
        rho = "-" if None in rv else "%.3f" % mean(rv)
        js = [json.load(open(os.path.join(out, "prefix-s%s-f%s.json" % (s, f)))) for s in seeds]
        for li in range(len(loads(js[0]))):
            g = {}
            for pol, key in [(p, k) for p in ("eldr", "footprint") for k in ("tpot_p50_ms", "tpot_p99_ms")]:
                v = []
                for j in js:
                    rows, rate = rows_by(j), loads(j)[li]
                    b = best(rows, rate, key)
                    v.append(change(rows[(pol, rate)][key], b) - change(rows[(pol + "-permuted", rate)][key], b))
                g[pol, key] = mean(v)
            pshare = mean(rows_by(j)[("footprint", loads(j)[li])]["predicted_share"] or 0 for j in js)
            lab = "prefill signature" if f == "full" else "first %s" % f
            print("| %s | %s | %s | %+.1f | %+.1f | %+.1f | %+.1f | %.0f%% |" % (
                lab, rho, os.environ.get("LOADS_PREFIX", "0.6,0.9").split(",")[li],
                g["eldr", "tpot_p50_ms"], g["eldr", "tpot_p99_ms"], g["footprint", "tpot_p50_ms"],
                g["footprint", "tpot_p99_ms"], 100 * (pshare if f != "full" else 0)))
    print()

for model in sorted({os.path.basename(f).split("-s")[0][len("mooncake-"):] for f in glob.glob(os.path.join(out, "mooncake-*-s*.json"))}):
    js = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, "mooncake-%s-s*.json" % model)))]
    cfg = js[0]["config"]
    print("(ii) Mooncake conversation structure, %s, %d lines (%d distinct blocks), %dP%dD, output <= %d tokens, "
          "mean decode batch %.1f (vllm footprint, top load), footprint; "
          "TPOT change vs the best load balancer of the same mode net of footprint-permuted (points), "
          "p99 vs the best load balancer (%%), mean of %d seeds; register %g ms" % (
              model, mc_n, cfg.get("mooncake_blocks", 0), cfg["prefill"], cfg["decode"], int(sys.argv[4]),
              mean(rows_by(j)[("footprint", loads(j)[-1])]["mean_batch"] for j in js), len(js), cfg["register_ms"]))
    print()
    print("| load | vllm p50 | sglang p50 | sglang-exact p50 | kept | vllm p99 | sglang p99 | exact p99 | predicted | exact TTFT cost ms | exact TPOT win ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for li, load in enumerate([0.2, 0.4, 0.6, 0.8, 0.95]):
        acc = {}
        for j in js:
            rows, rate = rows_by(j), loads(j)[li]
            for mode, sfx in (("vllm", ""), ("sglang", "@sglang"), ("sglang-exact", "@sglang-exact")):
                for key in ("tpot_p50_ms", "tpot_p99_ms"):
                    b = best(rows, rate, key, sfx)
                    net = change(rows[("footprint" + sfx, rate)][key], b) - change(rows[("footprint-permuted" + sfx, rate)][key], b)
                    acc.setdefault((mode, key, "net"), []).append(net)
                    acc.setdefault((mode, key, "raw"), []).append(change(rows[("footprint" + sfx, rate)][key], b))
            acc.setdefault("pred", []).append(rows[("footprint@sglang", rate)]["predicted_share"])
            acc.setdefault("ttft", []).append(rows[("footprint@sglang-exact", rate)]["ttft_p50_ms"] - rows[("footprint@sglang", rate)]["ttft_p50_ms"])
            acc.setdefault("tpot", []).append(rows[("footprint@sglang", rate)]["tpot_p50_ms"] - rows[("footprint@sglang-exact", rate)]["tpot_p50_ms"])
        v, s = mean(acc["vllm", "tpot_p50_ms", "net"]), mean(acc["sglang", "tpot_p50_ms", "net"])
        kept = "%.0f%%" % (100 * s / v) if v < -1 else "-" # a share of less than a point is noise
        print("| %g | %+.1f | %+.1f | %+.1f | %s | %+.1f | %+.1f | %+.1f | %.0f%% | %+.2f | %+.3f |" % (
            load, v, s, mean(acc["sglang-exact", "tpot_p50_ms", "net"]), kept,
            mean(acc["vllm", "tpot_p99_ms", "raw"]), mean(acc["sglang", "tpot_p99_ms", "raw"]),
            mean(acc["sglang-exact", "tpot_p99_ms", "raw"]), 100 * mean(acc["pred"]), mean(acc["ttft"]), mean(acc["tpot"])))
    print()
EOF
