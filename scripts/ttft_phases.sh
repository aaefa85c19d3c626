#!/usr/bin/env bash
# Where a stream's first token waits, through nginx and through loopwarden in turn:
#
#   scripts/ttft_phases.sh [PAYLOAD] [CONCURRENCY] [SECONDS] [ROUNDS]
#   scripts/ttft_phases.sh openai_2m_stream.json 1 3 3      # the defaults
#
# The time to first token of the harness's stream loads is mostly the mock's own 5 ms
# timer (6.2 ms ± its jitter), the same through any proxy, and that jitter is most of the
# spread between runs. This splits each request by the driver's and the mock's system
# calls, recorded with `perf record -a` on the syscall tracepoints:
#   upload    the driver starts writing the body -> the mock has read all of it
#   mock      -> the mock writes the first token
#   download  -> the driver has read it
# Only upload and download pass through the proxy. The upload is split further by the
# proxy's own calls:
#   in        the driver starts writing -> the proxy has read the whole body
#   work      -> the proxy starts writing it upstream
#   out       -> the mock has read all of it
# and, after `|`, how many reads the proxy took for the body and how long after the driver's
# last written byte the last one ended (lag: a proxy that keeps pace with the client has
# the body right after it). Medians per round are printed.
#
# Needs: root (perf on tracepoints), perf, nginx, and the harness's mock and driver built
# by scripts/bench.sh (in $BENCH_TARGET_DIR, default /tmp/lw-bench-target). The mock and
# driver run on CPU 0, the proxy under test on CPU 1 (as `PIN=1` does).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAYLOAD=${1:-openai_2m_stream.json}
C=${2:-1}
SECONDS_PER=${3:-3}
ROUNDS=${4:-3}
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
T=${BENCH_TARGET_DIR:-/tmp/lw-bench-target}/release
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/loopwarden}
PAY=$BENCH_WORK/harness/payloads/$PAYLOAD
for need in "$T/mockup" "$T/benchdrv" "$BIN" "$PAY"; do
  [ -e "$need" ] || { echo "ttft_phases: missing $need (run scripts/bench.sh once)" >&2; exit 1; }
done
command -v perf >/dev/null && command -v nginx >/dev/null || {
  echo "ttft_phases: needs perf and nginx" >&2; exit 1; }
case $PAYLOAD in anthropic*) URL_PATH=/v1/messages ;; *) URL_PATH=/v1/chat/completions ;; esac

W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
MOCK_PORT=18580 NGINX_PORT=18581 LW_PORT=18582
mkdir -p "$W/nginx/tmp"
# The harness's nginx: one worker, request bodies buffered in memory, streams unbuffered.
cat > "$W/nginx/nginx.conf" <<EOF
worker_processes 1; daemon off; master_process on; pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $W/nginx/tmp/body; proxy_temp_path $W/nginx/tmp/proxy;
  fastcgi_temp_path $W/nginx/tmp/f; uwsgi_temp_path $W/nginx/tmp/u; scgi_temp_path $W/nginx/tmp/s;
  client_max_body_size 64m; client_body_buffer_size 8m; keepalive_requests 100000;
  upstream mock { server 127.0.0.1:$MOCK_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / { proxy_pass http://mock; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; proxy_read_timeout 300s; }
  }
}
EOF
MOCK_ADDR=127.0.0.1:$MOCK_PORT MOCK_DELAY_MS=5 MOCK_CHUNKS=20 taskset -c 0 "$T/mockup" >/dev/null 2>&1 &
taskset -c 1 nginx -e "$W/nginx/error.log" -p "$W/nginx" -c "$W/nginx/nginx.conf" >/dev/null 2>&1 &
NGINX_MASTER=$!
LOOPWARDEN_OPENAI_BASE_URL=http://127.0.0.1:$MOCK_PORT LOOPWARDEN_ANTHROPIC_BASE_URL=http://127.0.0.1:$MOCK_PORT \
  RUST_LOG=warn taskset -c 1 "$BIN" serve --listen 127.0.0.1:$LW_PORT --db "sqlite://$W/log.db" >/dev/null 2>&1 &
LW_PID=$!
sleep 1.5
# nginx's one worker does the proxying (taskset execs, so $! is the master itself).
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)

drive() { # port seconds
  taskset -c 0 "$T/benchdrv" --url "http://127.0.0.1:$1$URL_PATH" --body "$PAY" -c "$C" \
    --duration "$2" --requests 100000000 --timeout 30 --warmup 0.3 \
    -H "authorization: Bearer sk-phases" -H "x-api-key: sk-phases" -H "anthropic-version: 2023-06-01" >/dev/null 2>&1
}
# perf's own writes of what it records would be recorded too (millions of events, with
# perf busy on a core under test): every event is filtered on the recording process's pid,
# which `exec` makes the shell's.
FILTERED='for call in recvfrom read write writev sendto; do
  for edge in enter exit; do
    set -- "$@" -e "syscalls:sys_${edge}_$call" --filter "common_pid != $$"
  done
done
exec perf record -q -a -o "$OUT" "$@"'
echo "payload $PAYLOAD, concurrency $C, ${SECONDS_PER}s per peer and round; medians in ms"
for round in $(seq 1 "$ROUNDS"); do
  for peer in nginx:$NGINX_PORT:$NGINX_WORKER loopwarden:$LW_PORT:$LW_PID; do
    IFS=: read -r name port pid <<<"$peer"
    drive "$port" 1
    OUT=$W/trace.data bash -c "$FILTERED" >/dev/null 2>&1 &
    rec=$!
    sleep 0.5
    drive "$port" "$SECONDS_PER"
    kill -INT $rec; wait $rec 2>/dev/null || true
    printf 'round %s %-10s ' "$round" "$name"
    perf script -i "$W/trace.data" -F comm,pid,tid,time,event,trace 2>/dev/null \
      | python3 "$ROOT/scripts/ttft_phases.py" "$pid"
  done
done
