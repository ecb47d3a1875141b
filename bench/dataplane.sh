#!/usr/bin/env bash
# dataplane.sh — the router's data plane against nginx and HAProxy (Debian's),
# all three in front of the same upstream (build/bench_upstream), measured in
# one run with the proxies interleaved round by round (A B C A B C ...),
# medians of ROUNDS. One process, one event loop each: `eldr serve --threads 1`
# (the full two-leg PD flow: prefill leg, signature, decision, decode leg),
# nginx `worker_processes 1`, HAProxy `nbthread 1` (one-leg reverse proxies).
#
# Sections (SECTIONS, default all of them):
#   replies  wrk over keep-alive connections: small replies at C connections,
#            and the realistic prefill reply (routed_experts of PROMPT_TOKENS
#            tokens x 48 layers x top-8: 2.1 MB at 4096) at 1 and C
#            connections. Per proxy: req/s, the proxy's CPU per request and
#            minor page faults per request (all its processes, /proc).
#            eldr runs the eldr policy with an artifact fitted on a synthetic
#            qwen3-30b-a3b trace (48 x 128, top-8), so it reads every reply's
#            routed_experts; the client's prompt is PROMPT_TOKENS tokens (the
#            router hashes its blocks: the signature cache is used), one-leg
#            proxies relay the 2.1 MB reply to the client.
#   memory   the proxy's resident memory per idle keep-alive connection
#            (IDLE_CONNS connections that each were served one request),
#            and per in-flight streaming request (STREAMS streams held open
#            by a slow upstream): (RSS with them - RSS before) / count.
#   stream   the token stream: STREAM_CONNS clients, each streaming
#            completions of STREAM_TOKENS tokens TOKEN_MS apart, with and
#            without stream_options.include_usage; per proxy: the proxy's
#            CPU per relayed token and the latency a token takes from the
#            upstream's send to the client's read (p50 / p99), next to the
#            same stream read straight from the upstream.
#   sigpath  the router's signature path on its own code (`eldr bench route`,
#            PROMPT_TOKENS tokens, SIG_ITERS rounds, every stage interleaved,
#            p50): the signature at each SIMD level (the CPU's, AVX2 at most,
#            portable) against a warm and a cold memcpy of the blob, and the
#            signature cache's stages against the signature; then callgrind's
#            instruction counts of the same stages (valgrind runs the AVX2
#            paths; skipped without valgrind).
#
# Every figure comes with the load average at its section's end: the
# machine's other work shows in it; read figures of one run side by side.
#
# usage: bench/dataplane.sh [BUILD_DIR]
#   env: SECTIONS="replies memory stream" ROUNDS=3 DURATION=5 CONNS=32
#        PROMPT_TOKENS=4096 IDLE_CONNS=2000 STREAMS=200 STREAM_CONNS=64
#        STREAM_TOKENS=200 TOKEN_MS=20 SIG_ITERS=200 PROXIES="nginx haproxy eldr"
#        CASES="small:32 big:1 big:32 new:32" (the replies section's cases)
#        ELDR_ARGS="" (more flags for eldr serve) ELDR=path/to/eldr (default BUILD_DIR/eldr)
#        ELDR_BASE=path/to/another/eldr (adds the proxy "eldr-base": before and after, interleaved)
# Skips (exit 0, says so) without wrk, nginx or haproxy.
set -euo pipefail
BUILD=${1:-build}
SECTIONS=${SECTIONS:-replies memory stream sigpath}
SIG_ITERS=${SIG_ITERS:-200}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONNS=${CONNS:-32}
PROMPT_TOKENS=${PROMPT_TOKENS:-4096}
IDLE_CONNS=${IDLE_CONNS:-2000}
STREAMS=${STREAMS:-200}
STREAM_CONNS=${STREAM_CONNS:-64}
STREAM_TOKENS=${STREAM_TOKENS:-200}
TOKEN_MS=${TOKEN_MS:-20}
ELDR_BASE=${ELDR_BASE:-}
PROXIES=${PROXIES:-nginx haproxy eldr${ELDR_BASE:+ eldr-base}}
ELDR_ARGS=${ELDR_ARGS:-}
ELDR=${ELDR:-$BUILD/eldr} # ELDR=path: another build of eldr against the same upstream (before and after)
UPSTREAM=$BUILD/bench_upstream
SSE=$BUILD/bench_sse
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
for tool in wrk "$NGINX" "$HAPROXY" python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "dataplane: skipped: $tool is not installed (apt-get install -y wrk nginx-light haproxy)"
    exit 0
  fi
done
for b in "$ELDR" "$UPSTREAM" "$SSE"; do [ -x "$b" ] || { echo "dataplane: $b not built" >&2; exit 2; }; done
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

BENCH=dataplane
# shellcheck source=bench/proc_lib.sh
source "$(dirname "$0")/proc_lib.sh"
HZ=$(getconf CLK_TCK)
load() { cut -d' ' -f1-3 /proc/loadavg; }
median() { tr ' ' '\n' <<<"$1" | awk '$1 != ""' | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ---- processes ----------------------------------------------------------------

# the pids of a proxy: the process and its children (nginx's workers)
tree() { echo "$1" $(pgrep -P "$1" 2>/dev/null || true); }
# "cpu_ticks minflt" summed over a proxy's processes
usage_of() {
  local p t=0 f=0
  for p in $(tree "$1"); do
    [ -r /proc/$p/stat ] || continue
    read -r a b < <(awk '{ split($0, x, ") "); split(x[2], s, " "); print s[12] + s[13], s[8] }' /proc/$p/stat)
    t=$((t + a)); f=$((f + b))
  done
  echo "$t $f"
}
rss_kb() {
  local p s=0
  for p in $(tree "$1"); do s=$((s + $(awk '/^VmRSS:/ { print $2 }' /proc/$p/status 2>/dev/null || echo 0))); done
  echo "$s"
}

# upstream NAME ARGS...: a bench_upstream; sets UPORT
upstream() {
  local name=$1
  shift
  "$UPSTREAM" "$@" > "$T/$name.out" 2> "$T/$name.err" &
  PIDS+=($!)
  for _ in $(seq 200); do
    UPORT=$(sed -n 's/^listening on //p' "$T/$name.out")
    [ -n "$UPORT" ] && return 0
    sleep 0.05
  done
  echo "dataplane: bench_upstream did not start" >&2
  cat "$T/$name.err" >&2
  exit 1
}

# start_proxy KIND UPSTREAM_PORT: sets PPID_ and PPORT
start_proxy() {
  local kind=$1 up=$2
  PPORT=$(free_port)
  case $kind in
  nginx)
    mkdir -p "$T/ng"
    cat > "$T/ng/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $T/ng/nginx.pid;
error_log $T/ng/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $T/ng/body;
  proxy_temp_path $T/ng/proxy;
  fastcgi_temp_path $T/ng/fcgi;
  uwsgi_temp_path $T/ng/uwsgi;
  scgi_temp_path $T/ng/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  client_max_body_size 64m;
  client_body_buffer_size 64k;
  upstream u { server 127.0.0.1:$up; keepalive 512; }
  server {
    listen 127.0.0.1:$PPORT;
    location / {
      proxy_pass http://u;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering $NGX_BUFFERING;
      proxy_max_temp_file_size 0;
      proxy_read_timeout 300s;
    }
  }
}
EOF
    "$NGINX" -c "$T/ng/nginx.conf" -p "$T/ng" > "$T/ng/out" 2>&1 &
    PPID_=$!
    ;;
  haproxy)
    cat > "$T/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  option http-keep-alive
  option http-no-delay
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  timeout http-keep-alive 300s
frontend f
  bind 127.0.0.1:$PPORT
  default_backend b
backend b
  http-reuse always
  server u 127.0.0.1:$up maxconn 4096
EOF
    "$HAPROXY" -db -f "$T/haproxy.cfg" > "$T/haproxy.out" 2>&1 &
    PPID_=$!
    ;;
  eldr | eldr-base)
    local bin=$ELDR
    [ "$kind" = eldr-base ] && bin=$ELDR_BASE
    # shellcheck disable=SC2086
    "$bin" serve --quiet --port "$PPORT" --threads 1 --prefill "http://127.0.0.1:$up" \
      --decode "http://127.0.0.1:$up" --health-interval 0 $EPOLICY $ELDR_ARGS \
      > "$T/eldr.out" 2> "$T/eldr.err" &
    PPID_=$!
    ;;
  direct)
    PPID_=-
    PPORT=$up
    return 0
    ;;
  esac
  PIDS+=($PPID_)
  wait_port "$PPORT" || { cat "$T"/*.err "$T/ng/out" "$T/haproxy.out" 2>/dev/null >&2; exit 1; }
}
stop_proxy() {
  [ "$PPID_" = - ] && return 0
  kill "$PPID_" 2>/dev/null || true
  wait "$PPID_" 2>/dev/null || true
}

# ---- replies --------------------------------------------------------------------

# a prompt of N tokens for eldr's tokenizer: words of at most 4 characters
# ("w" and three hex digits) are one token each
words() { python3 -c "import sys; print(' '.join('w%x' % (i % 0xfff) for i in range(int(sys.argv[1]))))" "$1"; }

# wrk_run KIND CONNS LUA: RES="req/s cpu_us/request faults/request"
wrk_run() {
  local kind=$1 c=$2 lua=$3 out u0 u1 n rps
  local url="http://127.0.0.1:$PPORT/v1/completions"
  wrk -t1 -c"$c" -d1s -s "$lua" "$url" > /dev/null 2>&1 || true # warm-up: pools, caches
  u0=$(usage_of "$PPID_")
  out=$(wrk -t"$(( c > 1 ? 2 : 1 ))" -c"$c" -d"${DURATION}s" -s "$lua" "$url")
  u1=$(usage_of "$PPID_")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  n=$(awk '/requests in/ { print $1 }' <<<"$out")
  local bad
  bad=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
  [ -z "$bad" ] || echo "dataplane: $kind: $bad non-2xx answers" >&2
  RES=$(awk -v a="$u0" -v b="$u1" -v n="$n" -v hz="$HZ" -v r="$rps" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    printf "%s %.1f %.2f", r, (y[1] - x[1]) / hz / n * 1e6, (y[2] - x[2]) / n }')
}

section_replies() {
  echo "== replies: wrk keep-alive, ${DURATION}s per run, medians of $ROUNDS interleaved rounds" >&2
  cat > "$T/small.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"prompt":"Hello, how are you today?","max_tokens":8}'
wrk.headers["Content-Type"] = "application/json"
EOF
  cat > "$T/big.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"prompt":"$(words "$PROMPT_TOKENS")","max_tokens":8}'
wrk.headers["Content-Type"] = "application/json"
EOF
  # the same prompt length, but a new prompt every request (its first two
  # words random: every block hash new): eldr decodes every reply whole and
  # stores every block, where the prompt above is the signature cache's
  cat > "$T/new.lua" <<EOF
local rest = '$(words "$PROMPT_TOKENS" | cut -d' ' -f3-)'
function init(args)
  math.randomseed(tonumber(tostring({}):match("0x(%x+)"), 16) % 2147483647 + os.time())
end
function request()
  local body = string.format('{"prompt":"q%x r%x %s","max_tokens":8}', math.random(0, 4095), math.random(0, 4095), rest)
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
EOF
  NGX_BUFFERING=on # nginx's default (in memory: proxy_max_temp_file_size 0)
  upstream up_small
  local up_small=$UPORT
  upstream up_big --prefill-tokens "$PROMPT_TOKENS"
  local up_big=$UPORT
  local size
  size=$(sed -n 's/^prefill reply \([0-9]*\) bytes/\1/p' "$T/up_big.out")
  # an artifact for 48 x 128 x top-8: eldr reads the replies' routed_experts
  "$ELDR" trace gen --model qwen3-30b-a3b --requests 200 --max-decode-tokens 16 -q -o "$T/trace.jsonl"
  "$ELDR" fit --trace "$T/trace.jsonl" --decoders 2 -o "$T/art.json" > /dev/null
  declare -gA R
  local cases
  read -r -a cases <<<"${CASES:-small:$CONNS big:1 big:$CONNS new:$CONNS}"
  for r in $(seq "$ROUNDS"); do
    for cs in "${cases[@]}"; do
      kind=${cs%%:*} c=${cs##*:}
      for p in $PROXIES; do
        local up=$up_small lua=$T/small.lua
        EPOLICY="--policy jsq"
        if [ "$kind" != small ]; then
          up=$up_big lua=$T/$kind.lua EPOLICY="--policy eldr --artifact $T/art.json"
        fi
        start_proxy "$p" "$up"
        wrk_run "$p" "$c" "$lua"
        stop_proxy
        R[$kind.$c.$p]+="$RES;"
        echo "round $r: $kind c$c $p: $RES (req/s, CPU us/request, faults/request)  load $(load)" >&2
      done
    done
  done
  echo
  echo "### Replies (wrk keep-alive, ${DURATION} s, medians of $ROUNDS interleaved rounds; load average $(load))"
  echo
  echo "big: the prefill reply with routed_experts of $PROMPT_TOKENS tokens x 48 x top-8 ($size bytes with its head),"
  echo "one prompt of $PROMPT_TOKENS tokens repeated (eldr's signature cache holds it); new: the same reply, a new"
  echo "prompt every request (eldr reads every reply whole and stores every block)"
  echo
  echo "| case | proxy | req/s | vs nginx | CPU us/request | vs nginx | minor faults/request |"
  echo "|---|---|---|---|---|---|---|"
  for cs in "${cases[@]}"; do
    kind=${cs%%:*} c=${cs##*:}
    local nr nc
    nr=$(median "$(tr ';' '\n' <<<"${R[$kind.$c.nginx]:-}" | cut -d' ' -f1)")
    nc=$(median "$(tr ';' '\n' <<<"${R[$kind.$c.nginx]:-}" | cut -d' ' -f2)")
    for p in $PROXIES; do
      local v=${R[$kind.$c.$p]}
      local m1 m2 m3
      m1=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f1)")
      m2=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f2)")
      m3=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f3)")
      awk -v k="$kind c$c" -v p="$p" -v a="$m1" -v b="$m2" -v f="$m3" -v nr="$nr" -v nc="$nc" 'BEGIN {
        vr = (nr != "-" && nr > 0) ? sprintf("%.2fx", a / nr) : "-";
        vc = (nc != "-" && nc > 0) ? sprintf("%.2fx", b / nc) : "-";
        printf "| %s | %s | %.0f | %s | %.1f | %s | %.2f |\n", k, p, a, vr, b, vc, f }'
    done
  done
}

# ---- memory ------------------------------------------------------------------------

# python: open N connections to PORT; mode idle (one request each, read whole,
# kept open) or stream (a streaming request each, held after its first
# event); prints "ready" and waits for a line on stdin, then closes them
cat > "$T/hold.py" <<'EOF'
import socket, sys, select
port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = b'{"prompt":"Hello, how are you today?","max_tokens":1000%s}' % (b',"stream":true' if mode == "stream" else b"")
req = b"POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
def read_reply(s):  # idle: the whole reply (Content-Length); stream: the first event
    buf = b""
    while True:
        d = s.recv(65536)
        if not d:
            sys.exit("hold.py: closed by the server")
        buf += d
        h = buf.find(b"\r\n\r\n")
        if h < 0:
            continue
        if mode == "stream":
            if b"data:" in buf[h:]:
                break
        else:
            cl = [l for l in buf[:h].split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if cl and len(buf) - h - 4 >= int(cl[0].split(b":")[1]):
                break
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    socks.append(s)
    if mode == "idle":  # one request at a time: only idle connections stay
        read_reply(s)
if mode == "stream":  # all streams in flight at once
    for s in socks:
        read_reply(s)
print("ready", flush=True)
sys.stdin.readline()
EOF

# mem_run KIND N MODE: RES="KB per connection"
mem_run() {
  local kind=$1 n=$2 mode=$3 r0 r1
  sleep 0.5
  python3 "$T/hold.py" "$PPORT" 50 "$mode" <<<"" > /dev/null # warm the proxy's pools
  sleep 0.5
  r0=$(rss_kb "$PPID_")
  coproc HOLD { python3 "$T/hold.py" "$PPORT" "$n" "$mode"; }
  local line
  read -r line <&"${HOLD[0]}"
  [ "$line" = ready ] || { echo "dataplane: hold.py failed" >&2; exit 1; }
  sleep 1
  r1=$(rss_kb "$PPID_")
  echo >&"${HOLD[1]}"
  wait "$HOLD_PID" 2>/dev/null || true
  RES=$(awk -v a="$r0" -v b="$r1" -v n="$n" 'BEGIN { printf "%.2f", (b - a) / n }')
}

section_memory() {
  echo "== memory: $IDLE_CONNS idle keep-alive connections, $STREAMS in-flight streams" >&2
  NGX_BUFFERING=off
  upstream up_mem
  local up_fast=$UPORT
  upstream up_slow --stream-tokens 100000 --token-interval-ms 1000
  local up_slow=$UPORT
  EPOLICY="--policy jsq"
  declare -gA M
  for r in $(seq "$ROUNDS"); do
    for p in $PROXIES; do
      start_proxy "$p" "$up_fast"
      mem_run "$p" "$IDLE_CONNS" idle
      M[idle.$p]+="$RES "
      stop_proxy
      start_proxy "$p" "$up_slow"
      mem_run "$p" "$STREAMS" stream
      M[stream.$p]+="$RES "
      stop_proxy
      echo "round $r: $p: KB per idle connection, per stream: $(awk '{ print $NF }' <<<"${M[idle.$p]}") $(awk '{ print $NF }' <<<"${M[stream.$p]}")  load $(load)" >&2
    done
  done
  echo
  echo "### Memory (resident KB per connection, medians of $ROUNDS rounds; load average $(load))"
  echo
  echo "| proxy | KB per idle keep-alive connection ($IDLE_CONNS) | KB per in-flight stream ($STREAMS) |"
  echo "|---|---|---|"
  for p in $PROXIES; do
    echo "| $p | $(median "${M[idle.$p]}") | $(median "${M[stream.$p]}") |"
  done
}

# ---- stream --------------------------------------------------------------------------

section_stream() {
  echo "== stream: $STREAM_CONNS clients, $STREAM_TOKENS tokens ${TOKEN_MS} ms apart, ${DURATION}s per run" >&2
  NGX_BUFFERING=off # what an SSE deployment sets (else nginx holds events until a buffer fills)
  upstream up_stream --stream-tokens "$STREAM_TOKENS" --token-interval-ms "$TOKEN_MS"
  local up=$UPORT
  EPOLICY="--policy jsq"
  declare -gA S
  for r in $(seq "$ROUNDS"); do
    for u in "" --usage; do
      for p in direct $PROXIES; do
        start_proxy "$p" "$up"
        local u0=0 u1=0 out
        [ "$PPID_" = - ] || u0=$(usage_of "$PPID_")
        out=$("$SSE" --port "$PPORT" --conns "$STREAM_CONNS" --duration "$DURATION" $u)
        [ "$PPID_" = - ] || u1=$(usage_of "$PPID_")
        stop_proxy
        local tok p50 p99 err
        tok=$(awk '{ print $2 }' <<<"$out"); err=$(awk '{ print $6 }' <<<"$out")
        p50=$(awk '{ print $10 }' <<<"$out"); p99=$(awk '{ print $14 }' <<<"$out")
        [ "$err" = 0 ] || echo "dataplane: stream $p: $err failed requests" >&2
        # CPU per token over the whole run (the warm-up tenth's tokens counted in)
        local cpu
        cpu=$(awk -v a="$u0" -v b="$u1" -v t="$tok" -v hz="$HZ" 'BEGIN { split(a, x, " "); split(b, y, " ");
          printf "%.2f", (y[1] - x[1]) / hz / (t / 0.9) * 1e6 }')
        [ "$PPID_" = - ] && cpu=-
        S[$u.$p]+="$cpu $p50 $p99 $tok;"
        echo "round $r: stream${u:+ $u} $p: CPU us/token $cpu, latency p50 $p50 us p99 $p99 us, $tok tokens  load $(load)" >&2
      done
    done
  done
  echo
  echo "### Token stream ($STREAM_CONNS streams of $STREAM_TOKENS tokens, ${TOKEN_MS} ms apart; ${DURATION} s, medians of $ROUNDS interleaved rounds; load average $(load))"
  echo
  echo "| usage chunk | proxy | CPU us/token | vs nginx | latency p50 us | added p50 us | latency p99 us | added p99 us |"
  echo "|---|---|---|---|---|---|---|---|"
  for u in "" --usage; do
    local d50 d99 nc
    d50=$(median "$(tr ';' '\n' <<<"${S[$u.direct]}" | cut -d' ' -f2)")
    d99=$(median "$(tr ';' '\n' <<<"${S[$u.direct]}" | cut -d' ' -f3)")
    nc=$(median "$(tr ';' '\n' <<<"${S[$u.nginx]:-}" | cut -d' ' -f1)")
    for p in direct $PROXIES; do
      local v=${S[$u.$p]} c l50 l99
      c=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f1 | grep -v -- -)")
      l50=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f2)")
      l99=$(median "$(tr ';' '\n' <<<"$v" | cut -d' ' -f3)")
      awk -v u="${u:+include_usage}" -v p="$p" -v c="$c" -v nc="$nc" -v a="$l50" -v b="$l99" -v d5="$d50" -v d9="$d99" 'BEGIN {
        vc = (c != "-" && nc != "-" && nc > 0) ? sprintf("%.2fx", c / nc) : "-";
        printf "| %s | %s | %s | %s | %.0f | %+.0f | %.0f | %+.0f |\n", (u == "" ? "no" : "yes"), p, c, vc, a, a - d5, b, b - d9 }'
    done
  done
}

# ---- sigpath ---------------------------------------------------------------------------

section_sigpath() {
  echo "== sigpath: eldr bench route --tokens $PROMPT_TOKENS --iters $SIG_ITERS" >&2
  local out
  out=$(OPENBLAS_NUM_THREADS=1 "$ELDR" bench route --tokens "$PROMPT_TOKENS" --iters "$SIG_ITERS" --json)
  # p50 of a stage, microseconds
  p50() { jq -r --arg s "$1" '.rows[] | select(.stage == $s) | .p50_us' <<<"$out"; }
  local warm cold hot sig
  warm=$(p50 "memcpy of the base64 blob"); cold=$(p50 "memcpy of the blob, cold"); hot=$(p50 "memcpy of the blob, hot")
  sig=$(p50 "signature (no cache)")
  echo
  echo "### Signature path ($PROMPT_TOKENS tokens, 48 x 128, top-8; OPENBLAS_NUM_THREADS=1 eldr bench route --tokens $PROMPT_TOKENS --iters $SIG_ITERS, p50 of one interleaved run; CPU level $("$ELDR" --version | sed -n 's/^simd: \([a-z0-9]*\).*/\1/p'); load average $(load))"
  echo
  echo "(warm: the memcpy interleaved with the stages, as the signature runs; cold: source and destination"
  echo "out of the caches; hot: the same memcpy repeated at once, the second timed)"
  echo
  echo "| stage | p50 us | vs warm memcpy | vs cold memcpy | vs hot memcpy | vs signature |"
  echo "|---|---|---|---|---|---|"
  for st in "memcpy of the base64 blob" "memcpy of the blob, cold" "memcpy of the blob, hot" "signature (no cache)" \
    "signature, AVX2 at most" "signature, portable" "signature, new, cache on" "store block rows, new" \
    "store block rows, held" "cached prompt, all rows" "cached prompt, last block"; do
    awk -v n="$st" -v v="$(p50 "$st")" -v w="$warm" -v c="$cold" -v h="$hot" -v s="$sig" \
      'BEGIN { printf "| %s | %.1f | %.2fx | %.2fx | %.2fx | %.2fx |\n", n, v, v / w, v / c, v / h, v / s }'
  done
  command -v valgrind >/dev/null 2>&1 || { echo; echo "(valgrind not found: no instruction counts)"; return 0; }
  echo
  echo "Instruction counts (valgrind --tool=callgrind --toggle-collect=STAGE eldr bench route --tokens $PROMPT_TOKENS --iters 3;"
  echo "valgrind has no AVX-512: the AVX2 paths; 15 calls a stage: 12 warm-up rounds and 3)"
  echo
  echo "| stage function | instructions | vs stage_sig |"
  echo "|---|---|---|"
  local tmp base=""
  tmp=$(mktemp -d)
  for st in stage_sig stage_sig_portable stage_extract_new stage_store_new stage_store_held stage_cached_all stage_cached_last; do
    OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" --toggle-collect="$st" \
      "$ELDR" bench route --tokens "$PROMPT_TOKENS" --iters 3 >/dev/null 2>"$tmp/log"
    local ir
    ir=$(grep -o 'Collected : [0-9]*' "$tmp/log" | awk '{ print $3 }')
    [ -n "$base" ] || base=$ir
    awk -v n="$st" -v v="$ir" -v b="$base" 'BEGIN { printf "| %s | %d | %.3fx |\n", n, v, v / b }'
  done
  rm -rf "$tmp"
}

echo "# bench/dataplane.sh: $(nproc) cores, $(uname -r), nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), HAProxy $("$HAPROXY" -v | head -1 | awk '{ print $3 }'), wrk, eldr $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')"
for s in $SECTIONS; do
  case $s in
  replies) section_replies ;;
  memory) section_memory ;;
  stream) section_stream ;;
  sigpath) section_sigpath ;;
  *) echo "dataplane: unknown section $s" >&2; exit 2 ;;
  esac
done
