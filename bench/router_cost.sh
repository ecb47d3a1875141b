#!/usr/bin/env bash
# router_cost.sh — what one proxied request costs the router, in counts that
# do not depend on the machine's load: instructions (callgrind) and system
# calls (strace -c) per request of `eldr serve --threads 1 --policy jsq` (the
# full two-leg PD flow) at one keep-alive connection, in front of an nginx
# answering every POST with a fixed completion that carries
# kv_transfer_params (as bench/threads_vs_nginx.sh). Instructions: the
# difference of a run of N2 and one of N1 requests, divided by N2 - N1, so
# start-up and shutdown cancel out; system calls: strace attached to a warm
# router for N2 requests.
#
# usage: bench/router_cost.sh [BUILD_DIR] (env: N1=500 N2=2500; PROMPT_TOKENS=N: a
# prompt of N stand-in tokens "w0 w1 ...", so that the router hashes its
# 16-token blocks; default: a short prompt of one sentence; GAP_S=S: the idle
# regime, system calls only, of N2 requests S seconds apart with health checks
# off, e.g. GAP_S=1.2 N2=16: what a pooled connection idle that long costs)
# Skips (exit 0, says so) without nginx, valgrind, strace or python3.
set -euo pipefail
BUILD=${1:-build}
N1=${N1:-500}
N2=${N2:-2500}
PROMPT_TOKENS=${PROMPT_TOKENS:-0}
GAP_S=${GAP_S:-0}
ELDR=$BUILD/eldr
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for tool in valgrind strace python3 "$NGINX"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "router_cost: skipped: $tool is not installed"
    exit 0
  fi
done
[ -x "$ELDR" ] || { echo "router_cost: $ELDR not built" >&2; exit 2; }

BENCH=router_cost
# shellcheck source=bench/proc_lib.sh
source "$(dirname "$0")/proc_lib.sh"
BODY='{"id":"cmpl-b","object":"text_completion","choices":[{"index":0,"text":" a short answer","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":4},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e0","remote_block_ids":[1,2,3],"remote_host":"127.0.0.1","remote_port":5600}}'
UP=$(free_port)
mkdir -p "$T/up"
cat > "$T/up/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $T/up/nginx.pid;
error_log $T/up/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $T/up/body;
  proxy_temp_path $T/up/proxy;
  fastcgi_temp_path $T/up/fcgi;
  uwsgi_temp_path $T/up/uwsgi;
  scgi_temp_path $T/up/scgi;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UP; location / { default_type application/json; return 200 '$BODY'; } }
}
EOF
"$NGINX" -c "$T/up/nginx.conf" -p "$T/up" > "$T/up/out" 2>&1 &
PIDS+=($!)
wait_port "$UP"

# n sequential requests over one keep-alive connection
cat > "$T/client.py" <<'EOF'
import http.client, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
gap = float(sys.argv[4])
words = int(sys.argv[3])
prompt = " ".join("w%d" % i for i in range(words)) if words else "Hello, how are you today?"
body = '{"prompt":"%s","max_tokens":8}' % prompt
for _ in range(int(sys.argv[2])):
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    if r.status != 200:
        sys.exit("router_cost: HTTP %d" % r.status)
    time.sleep(gap)
EOF

# run_under N TOOL...: the router under a tool for N requests
run_under() {
  local n=$1
  shift
  local port
  port=$(free_port)
  "$@" "$ELDR" serve --quiet --port "$port" --threads 1 --policy jsq --prefill "http://127.0.0.1:$UP" \
    --decode "http://127.0.0.1:$UP" > "$T/eldr.out" 2> "$T/eldr.err" &
  local pid=$!
  PIDS+=($pid)
  wait_port "$port"
  python3 "$T/client.py" "$port" "$n" "$PROMPT_TOKENS" 0
  # the router itself (strace's child; valgrind runs it in its own process)
  kill -INT "$(pgrep -P "$pid" | head -1 || true)" 2>/dev/null || kill -INT "$pid"
  wait "$pid" 2>/dev/null || true
}

instr() { # total Ir of a callgrind output
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
if [ "$GAP_S" = 0 ]; then
  run_under "$N1" valgrind --tool=callgrind --callgrind-out-file="$T/cg1" 2>/dev/null
  run_under "$N2" valgrind --tool=callgrind --callgrind-out-file="$T/cg2" 2>/dev/null
  hc=()
else
  hc=(--health-interval 0)
fi
# system calls: strace attached to the warm router (its threads' calls during
# the N2 requests only; a router started under strace also counts the
# start-up spinning of other libraries' threads)
port=$(free_port)
"$ELDR" serve --quiet --port "$port" --threads 1 --policy jsq --prefill "http://127.0.0.1:$UP" \
  --decode "http://127.0.0.1:$UP" "${hc[@]}" > "$T/eldr.out" 2> "$T/eldr.err" &
pid=$!
PIDS+=($pid)
wait_port "$port"
python3 "$T/client.py" "$port" 50 "$PROMPT_TOKENS" 0
strace -f -c -o "$T/st" -p "$pid" 2> /dev/null &
spid=$!
sleep 1 # attached to every thread
python3 "$T/client.py" "$port" "$N2" "$PROMPT_TOKENS" "$GAP_S"
kill -INT "$spid"
wait "$spid" 2>/dev/null || true

# strace -c rows: % time, seconds, usecs/call, calls, [errors,] syscall
calls() { awk '$NF == "total" { print NF == 6 ? $(NF - 2) : $(NF - 1) }' "$1"; }
prompt="a short sentence"
[ "$PROMPT_TOKENS" != 0 ] && prompt="$PROMPT_TOKENS tokens"
if [ "$GAP_S" = 0 ]; then
  echo "eldr serve --threads 1 --policy jsq, one keep-alive connection, ($N2 - $N1) requests, prompt: $prompt"
  awk -v a="$(instr "$T/cg1")" -v b="$(instr "$T/cg2")" -v n=$((N2 - N1)) \
    'BEGIN { printf "instructions per request (callgrind): %.0f\n", (b - a) / n }'
else
  echo "eldr serve --threads 1 --policy jsq --health-interval 0, one keep-alive connection, $N2 requests" \
    "$GAP_S s apart, prompt: $prompt"
fi
awk -v c="$(calls "$T/st")" -v n="$N2" 'BEGIN { printf "system calls per request (strace -c):  %.1f\n", c / n }'
echo "by call, per request:"
awk -v n="$N2" '/^-+ /{f++; next} f == 1 { c = NF == 6 ? $(NF - 2) : $(NF - 1); if (c / n >= 0.05) printf "  %-12s %.2f\n", $NF, c / n }' "$T/st"
