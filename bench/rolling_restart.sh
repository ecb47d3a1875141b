#!/usr/bin/env bash
# rolling_restart.sh BUILD_DIR — a rolling restart of two `eldr serve`
# replicas behind HAProxy, under `eldr bench load`: the load balancer, the
# load generator, the routers and the emulated engines are each their own
# process, as in production. Each replica in turn gets SIGTERM (it drains:
# /health 503, listener closed, requests in flight finish), a new process
# takes its port once the listener closed, and the old one must exit 0.
# HAProxy health-checks /health (inter 300 ms) and retries what a load
# balancer may retry (retry-on conn-failure empty-response: a refused
# connection, or a kept-alive connection closed before any response byte).
# Prints the load generator's table and the failed-request count (target 0);
# exits 1 when a request failed or a replica did not exit 0, 77 (skip)
# without haproxy. SHUTDOWN_TIMEOUT=0 (default 30) shows what a restart
# without the drain costs: the requests in flight at each SIGTERM are cut. tests/serve/test_drain.c checks the same in ctest with a
# client that retries as a balancer does.
set -euo pipefail
build=${1:?usage: rolling_restart.sh BUILD_DIR}
eldr="$build/eldr"
command -v haproxy >/dev/null || { echo "skip: haproxy is not installed (Debian: haproxy)"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

port_of() { # the port a process printed in "listening on ...:PORT", within 20 s
  for _ in $(seq 200); do
    grep -om1 'listening on [^ ]*' "$1" 2>/dev/null | grep -o '[0-9]*$' && return
    sleep 0.1
  done
  echo "no 'listening on' line in $1" >&2; return 1
}
closed() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$eldr" trace gen --requests 300 --max-decode-tokens 96 -q -o "$tmp/t.jsonl"
"$eldr" worker --role prefill --port 0 --time-scale 0.5 > "$tmp/p.out" 2>/dev/null & pids+=($!)
"$eldr" worker --role decode --port 0 --time-scale 0.5 > "$tmp/d0.out" 2>/dev/null & pids+=($!)
"$eldr" worker --role decode --port 0 --time-scale 0.5 > "$tmp/d1.out" 2>/dev/null & pids+=($!)
pp=$(port_of "$tmp/p.out"); d0=$(port_of "$tmp/d0.out"); d1=$(port_of "$tmp/d1.out")
router() { # router NAME PORT: an eldr serve replica; its pid in rpid
  "$eldr" serve --port "$2" --prefill "http://127.0.0.1:$pp" --decode "http://127.0.0.1:$d0" \
    --decode "http://127.0.0.1:$d1" --threads 2 --shutdown-timeout "${SHUTDOWN_TIMEOUT:-30}" > "$tmp/$1.out" 2> "$tmp/$1.err" &
  rpid=$!
  pids+=("$rpid")
}
router r0 0; r0=$rpid; p0=$(port_of "$tmp/r0.out")
router r1 0; r1=$rpid; p1=$(port_of "$tmp/r1.out")
ha=$(free_port)
cat > "$tmp/haproxy.cfg" <<EOF
defaults
  mode http
  timeout connect 2s
  timeout client 120s
  timeout server 120s
  retries 3
  option redispatch 1
  retry-on conn-failure empty-response
  option http-buffer-request
frontend fe
  bind 127.0.0.1:$ha
  default_backend routers
backend routers
  balance roundrobin
  option httpchk GET /health
  http-check expect status 200
  default-server inter 300ms fall 1 rise 2
  server r0 127.0.0.1:$p0 check
  server r1 127.0.0.1:$p1 check
EOF
haproxy -f "$tmp/haproxy.cfg" -db > "$tmp/haproxy.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do closed "$ha" || break; sleep 0.1; done
"$eldr" bench load --target "http://127.0.0.1:$ha" --trace "$tmp/t.jsonl" --rate 40 --duration 16 \
  --max-tokens 96 --no-trace-id --drain 60 > "$tmp/load.txt" 2>&1 & load=$!
restart() { # restart NAME OLDPID PORT
  sleep 4
  kill -TERM "$2"
  for _ in $(seq 500); do closed "$3" && break; sleep 0.01; done
  router "$1.new" "$3" # the new process takes the port while the old one drains
  local rc=0
  wait "$2" || rc=$?
  local drained
  drained=$(grep -o 'drained in [^;]*' "$tmp/$1.err" | head -1 || true)
  echo "replica $1 (port $3): SIGTERM, old process exit $rc, ${drained:-no drain line}"
  [ "$rc" -eq 0 ] || { echo "replica $1 did not exit 0" >&2; exit 1; }
}
restart r0 "$r0" "$p0"
restart r1 "$r1" "$p1"
wait "$load" || true
cat "$tmp/load.txt"
failed=$(sed -n 's/^requests [0-9]*: ok [0-9]*, failed \([0-9]*\), timed out \([0-9]*\).*/\1 \2/p' "$tmp/load.txt" |
         awk '{print $1 + $2}')
failed=${failed:-?}
echo "rolling restart behind HAProxy under eldr bench load: failed requests $failed (target 0)"
[ "$failed" = 0 ]
