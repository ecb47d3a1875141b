#!/usr/bin/env bash
# Scrape a live router's /metrics (after real traffic through emulated
# workers) and lint it with promtool (Debian package `prometheus`).
#   scripts/check_metrics.sh BUILD_DIR
# Without promtool on PATH: exit 77 (skipped) unless ELDR_REQUIRE_PROMTOOL=1,
# then exit 1. CI (.ci/run) installs promtool and requires it.
set -euo pipefail
build=${1:-build}
eldr="$build/eldr"
if ! command -v promtool >/dev/null 2>&1; then
  if [ "${ELDR_REQUIRE_PROMTOOL:-0}" = 1 ]; then echo "promtool not found" >&2; exit 1; fi
  echo "promtool not found: skipped" >&2; exit 77
fi
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
# "... listening on http://127.0.0.1:PORT ..." / "listening on HOST:PORT": the port
wait_port() {
  for _ in $(seq 200); do
    if grep -q "listening on" "$1" 2>/dev/null; then
      grep -o "listening on [^ ]*" "$1" | head -n1 | sed 's/.*://'; return 0
    fi
    sleep 0.05
  done
  echo "no 'listening on' in $1" >&2; return 1
}
"$eldr" worker --role prefill --port 0 >"$tmp/p.out" 2>"$tmp/p.err" & pids+=($!)
"$eldr" worker --role decode --port 0 >"$tmp/d.out" 2>"$tmp/d.err" & pids+=($!)
pp=$(wait_port "$tmp/p.out"); dp=$(wait_port "$tmp/d.out")
"$eldr" serve --port 0 --prefill "http://127.0.0.1:$pp" --decode "http://127.0.0.1:$dp" \
  --health-interval 0.2 --record "$tmp/rec" --record-experts 128 --quiet >"$tmp/r.out" 2>"$tmp/r.err" & pids+=($!)
rp=$(wait_port "$tmp/r.out")
for i in 1 2 3; do
  curl -sS -o /dev/null -w "%{http_code}\n" -H 'Content-Type: application/json' \
    -d "{\"prompt\":\"metrics check $i\",\"max_tokens\":4}" "http://127.0.0.1:$rp/v1/completions"
done
curl -sS -o /dev/null -d '{"prompt":' "http://127.0.0.1:$rp/v1/completions" || true # a bad request, counted
curl -sS -o "$tmp/metrics.txt" "http://127.0.0.1:$rp/metrics"
echo "$(grep -c '^# TYPE' "$tmp/metrics.txt") metric families, $(grep -vc '^#' "$tmp/metrics.txt") series"
# every family has HELP and TYPE (promtool lints the rest)
missing=$(comm -3 <(grep '^# HELP' "$tmp/metrics.txt" | awk '{print $3}' | sort) \
                  <(grep '^# TYPE' "$tmp/metrics.txt" | awk '{print $3}' | sort))
if [ -n "$missing" ]; then echo "HELP/TYPE mismatch: $missing" >&2; exit 1; fi
promtool check metrics <"$tmp/metrics.txt"
echo "promtool check metrics: clean"
