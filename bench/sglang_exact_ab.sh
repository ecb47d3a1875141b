#!/usr/bin/env bash
# sglang_exact_ab.sh — what --pd sglang-exact costs a request's TTFT next to
# --pd sglang, through the real router and emulated SGLang engines in real
# time (--time-scale 1): arm A is `eldr serve --pd sglang` in front of a stock
# emulated prefill (its forward waits for the decode's bootstrap), arm B
# `eldr serve --pd sglang-exact` in front of an `--exact` one (forward first,
# counts published, then the decode); both share two decoders. One request
# at a time, A and B alternating (the order swapped every round), each its
# own prompt of TOKENS words (no prefix shared between the arms), streamed,
# 16 output tokens. Prints per arm the router's access-log TTFT and e2e
# (median, p90) and how its decoders were chosen. The emulator's durations
# are its latency model's, not SGLang's: this measures the flow's ordering
# and the router's wait, not an engine.
#
# usage: bench/sglang_exact_ab.sh [BUILD_DIR] (env: N=30 rounds, TOKENS=300)
# Skips (exit 0, says so) without curl or python3.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
N=${N:-30}
TOKENS=${TOKENS:-300}
BENCH=sglang_exact_ab
for tool in curl python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$BENCH: skipped: $tool is not installed"; exit 0; }
done
# shellcheck source=bench/proc_lib.sh
source "$(dirname "$0")/proc_lib.sh"
cd "$T"
E=$BUILD/eldr
"$E" trace gen --model qwen3-30b-a3b --requests 100 -q -o calib.jsonl
"$E" fit --trace calib.jsonl --decoders 2 -q -o art.json > /dev/null 2>&1
pa=$(free_port); ba=$(free_port); pb=$(free_port); bb=$(free_port); d1=$(free_port); d2=$(free_port)
"$E" worker --engine sglang --role prefill --port "$pa" --bootstrap-port "$ba" --time-scale 1 > pa.log 2>&1 & PIDS+=($!)
"$E" worker --engine sglang --role prefill --exact --port "$pb" --bootstrap-port "$bb" --time-scale 1 > pb.log 2>&1 & PIDS+=($!)
"$E" worker --engine sglang --role decode --port "$d1" --time-scale 1 > d1.log 2>&1 & PIDS+=($!)
"$E" worker --engine sglang --role decode --port "$d2" --time-scale 1 > d2.log 2>&1 & PIDS+=($!)
for p in "$pa" "$pb" "$d1" "$d2"; do wait_port "$p"; done
ra=$(free_port); rb=$(free_port)
dec=(--decode "http://127.0.0.1:$d1" --decode "http://127.0.0.1:$d2" --artifact art.json --threads 1 -q)
"$E" serve --pd sglang --bootstrap-port "$ba" --prefill "http://127.0.0.1:$pa" "${dec[@]}" --port "$ra" --access-log a.jsonl > sa.log 2>&1 & PIDS+=($!)
"$E" serve --pd sglang-exact --bootstrap-port "$bb" --prefill "http://127.0.0.1:$pb" "${dec[@]}" --port "$rb" --access-log b.jsonl > sb.log 2>&1 & PIDS+=($!)
for p in "$ra" "$rb"; do curl -s --retry 30 --retry-connrefused --retry-delay 1 -o /dev/null "http://127.0.0.1:$p/health"; done
send() { # PORT ARM ROUND
  local prompt
  prompt=$(python3 -c "import random; random.seed('$2$3'); print(' '.join(random.choice(['expert','token','layer','route','decode','prefill','cache','batch']) for _ in range($TOKENS)))")
  curl -sf -H 'Content-Type: application/json' -d "{\"prompt\":\"$2 $prompt $3\",\"max_tokens\":16,\"stream\":true}" \
    "http://127.0.0.1:$1/v1/completions" > /dev/null
}
for i in $(seq 1 "$N"); do
  if [ $((i % 2)) = 1 ]; then send "$ra" A "$i"; send "$rb" B "$i"; else send "$rb" B "$i"; send "$ra" A "$i"; fi
done
echo "$BENCH: $N rounds, prompts of $TOKENS words, load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - <<'PY'
import json, statistics as st
print('%-34s %4s %12s %9s %12s  %s' % ('arm', 'n', 'ttft_ms p50', 'p90', 'e2e_ms p50', 'decoders chosen on'))
for f, name in (('a.jsonl', 'A --pd sglang (stock prefill)'), ('b.jsonl', 'B --pd sglang-exact (--exact)')):
    rows = [json.loads(l) for l in open(f)]
    t = sorted(r['ttft_ms'] for r in rows if r.get('ttft_ms') is not None)
    e = sorted(r['e2e_ms'] for r in rows)
    sig = {}
    for r in rows:
        sig[r.get('signature')] = sig.get(r.get('signature'), 0) + 1
    print('%-34s %4d %12.1f %9.1f %12.1f  %s' % (name, len(rows), st.median(t), t[max(0, int(0.9 * len(t)) - 1)],
                                              st.median(e), ', '.join('%s %d' % kv for kv in sorted(sig.items()))))
PY
