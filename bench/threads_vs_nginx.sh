#!/usr/bin/env bash
# threads_vs_nginx.sh — requests/s of `eldr serve --threads 1` and `--threads 2`
# (the full two-leg PD flow: prefill leg, decision, decode leg) against nginx
# with worker_processes 1 and 2 as a one-leg reverse proxy, all in front of the
# same upstream: an nginx (one worker) answering every POST with a fixed
# completion body that carries kv_transfer_params. Measured with wrk over
# keep-alive connections, the four proxies interleaved, ROUNDS rounds, medians.
#
# Per proxy: req/s at C connections, the proxy's CPU (all its processes, from
# /proc) per request, and the p50 latency at one connection minus the
# upstream's own p50 (the latency the proxy adds).
#
# usage: bench/threads_vs_nginx.sh [BUILD_DIR] (env: ROUNDS=3 DURATION=5 CONNS=32 WRK_THREADS=2)
# Skips (exit 0, says so) without wrk or nginx.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
WRK_THREADS=${WRK_THREADS:-2}
ELDR=$BUILD/eldr
for tool in wrk nginx; do
  if ! command -v $tool >/dev/null 2>&1 && [ ! -x /usr/sbin/$tool ]; then
    echo "threads_vs_nginx: skipped: $tool is not installed (apt-get install -y wrk nginx-light)"
    exit 0
  fi
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$ELDR" ] || { echo "threads_vs_nginx: $ELDR not built" >&2; exit 2; }

BENCH=threads_vs_nginx
# shellcheck source=bench/proc_lib.sh
source "$(dirname "$0")/proc_lib.sh"

BODY='{"id":"cmpl-b","object":"text_completion","choices":[{"index":0,"text":" a short answer","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":4},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e0","remote_block_ids":[1,2,3],"remote_host":"127.0.0.1","remote_port":5600}}'

# nginx in the foreground (its master is our child): conf name, worker count, server block
start_nginx() {
  local name=$1 workers=$2 server=$3
  mkdir -p "$T/$name"
  cat > "$T/$name/nginx.conf" <<EOF
worker_processes $workers;
daemon off;
master_process on;
pid $T/$name/nginx.pid;
error_log $T/$name/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $T/$name/body;
  proxy_temp_path $T/$name/proxy;
  fastcgi_temp_path $T/$name/fcgi;
  uwsgi_temp_path $T/$name/uwsgi;
  scgi_temp_path $T/$name/scgi;
  keepalive_requests 1000000;
  $server
}
EOF
  "$NGINX" -c "$T/$name/nginx.conf" -p "$T/$name" > "$T/$name/out" 2>&1 &
  NGPID=$!
  PIDS+=($NGPID)
}

UP=$(free_port)
start_nginx upstream 1 "server { listen 127.0.0.1:$UP; location / { default_type application/json; return 200 '$BODY'; } }"
wait_port "$UP"

cat > "$T/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"prompt":"Hello, how are you today?","max_tokens":8}'
wrk.headers["Content-Type"] = "application/json"
EOF

# CPU seconds (user + system) of a process and its children that are alive
cpu_of() {
  local total=0 p
  for p in $1 $(pgrep -P "$1" 2>/dev/null || true); do
    [ -r /proc/$p/stat ] || continue
    total=$(awk -v t="$total" '{ split($0, a, ") "); split(a[2], f, " "); print t + f[12] + f[13] }' /proc/$p/stat)
  done
  echo "$total"
}
HZ=$(getconf CLK_TCK)

# one measurement: wrk at CONNS (req/s, proxy CPU µs per request), then at 1 connection (p50 µs)
measure() {
  local url=$1 pid=$2 out c0 c1 rps n p50
  wrk -t1 -c4 -d1s -s "$T/post.lua" "$url" >/dev/null 2>&1 || true # warm-up
  c0=$(cpu_of "$pid")
  out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DURATION}s" -s "$T/post.lua" "$url")
  c1=$(cpu_of "$pid")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  n=$(awk '/requests in/ { print $1 }' <<<"$out")
  local non2xx
  non2xx=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
  [ -z "$non2xx" ] || echo "threads_vs_nginx: $url: $non2xx non-2xx answers" >&2
  out=$(wrk -t1 -c1 -d"${DURATION}s" --latency -s "$T/post.lua" "$url")
  p50=$(awk '$1 == "50%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); print v } else if (v ~ /ms$/) { sub(/ms$/, "", v); print v * 1000 } else { sub(/s$/, "", v); print v * 1e6 } }' <<<"$out")
  if [ "$pid" = "-" ]; then
    RES="$rps - $p50"
  else
    RES="$rps $(awk -v a="$c0" -v b="$c1" -v n="$n" -v hz="$HZ" 'BEGIN { printf "%.1f", (b - a) / hz / n * 1e6 }') $p50"
  fi
}

run_nginx() { # workers
  local port pid
  port=$(free_port)
  start_nginx "proxy$1" "$1" "upstream u { server 127.0.0.1:$UP; keepalive 256; }
  server { listen 127.0.0.1:$port; location / { proxy_pass http://u; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
  pid=$NGPID
  wait_port "$port"
  measure "http://127.0.0.1:$port/v1/completions" "$pid"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run_eldr() { # threads
  local pid port
  "$ELDR" serve --quiet --port 0 --threads "$1" --policy jsq --prefill "http://127.0.0.1:$UP" \
    --decode "http://127.0.0.1:$UP" > "$T/eldr.out" 2> "$T/eldr.err" &
  pid=$!
  PIDS+=($pid)
  for _ in $(seq 100); do
    port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$T/eldr.out")
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { cat "$T/eldr.err" >&2; exit 1; }
  measure "http://127.0.0.1:$port/v1/completions" "$pid"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

NAMES=("upstream direct" "nginx 1 worker" "nginx 2 workers" "eldr --threads 1" "eldr --threads 2")
declare -A RPS CPU P50
for r in $(seq "$ROUNDS"); do
  for i in 0 1 2 3 4; do
    case $i in
      0) measure "http://127.0.0.1:$UP/v1/completions" - ;;
      1) run_nginx 1 ;;
      2) run_nginx 2 ;;
      3) run_eldr 1 ;;
      4) run_eldr 2 ;;
    esac
    read -r a b c <<<"$RES"
    RPS[$i]+="$a "; CPU[$i]+="$b "; P50[$i]+="$c "
    echo "round $r: ${NAMES[$i]}: $a req/s, $b µs CPU/request, p50 at c1 $c µs" >&2
  done
done

median() { tr ' ' '\n' <<<"$1" | awk '$1 != "" && $1 != "-"' | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo
echo "$(nproc) cores ($(nproc --all) online), wrk -t$WRK_THREADS -c$CONNS -d${DURATION}s, medians of $ROUNDS interleaved rounds; upstream: nginx, 1 worker, fixed body"
echo
echo "| proxy | req/s c$CONNS | vs nginx 1 worker | vs nginx 2 workers | CPU µs/request | p50 c1 µs | added p50 µs |"
echo "|---|---|---|---|---|---|---|"
base1=$(median "${RPS[1]}"); base2=$(median "${RPS[2]}"); up50=$(median "${P50[0]}")
for i in 0 1 2 3 4; do
  m=$(median "${RPS[$i]}"); c=$(median "${CPU[$i]}"); p=$(median "${P50[$i]}")
  awk -v n="${NAMES[$i]}" -v m="$m" -v b1="$base1" -v b2="$base2" -v c="$c" -v p="$p" -v u="$up50" -v i="$i" 'BEGIN {
    add = (i == 0) ? "-" : sprintf("%.0f", p - u);
    printf "| %s | %.0f | %.2fx | %.2fx | %s | %.0f | %s |\n", n, m, m / b1, m / b2, c, p, add }'
done
