# proc_lib.sh — sourced by the shell benches: a temporary directory $T and
# the child processes in PIDS, both cleaned up on exit; free_port; wait_port.
# usage: BENCH=name; source "$(dirname "$0")/proc_lib.sh"
T=$(mktemp -d "/tmp/eldr_${BENCH}.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

# a TCP port nothing listens on now
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait (at most 10 s) until something accepts on 127.0.0.1:PORT
wait_port() {
  for _ in $(seq 200); do
    (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0
    sleep 0.05
  done
  echo "$BENCH: nothing listens on port $1" >&2
  return 1
}
