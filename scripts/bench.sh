#!/usr/bin/env bash
# Load benchmark of loopwarden beside a direct connection and nginx (issue 5), one command,
# with nothing from outside this repository but nginx (scripts/harness.sh: the load
# driver, the request bodies and the mock upstream are the repository's own):
#
#   scripts/bench.sh                 # 3 interleaved rounds, every load
#   scripts/bench.sh --quick         # 1 round, short windows
#   ROUNDS=5 LOADS="oa-8k-c1 an-200k-sse-c16" scripts/bench.sh
#
# It builds loopwarden in the `dist` profile (whole-program LTO, as published) and the load driver (examples/loadgen.rs), starts the
# mock upstream and each peer (a direct connection to the mock; nginx, proxying to it
# without buffering, when installed; loopwarden with detection and logging on, default
# config, a fresh SQLite log), and for each load drives every peer in turn, round after
# round in a rotating order, with the driver measuring each proxy's CPU time and memory
# over its window. Then it prints the table per load (scripts/bench_summary.py) and the
# issue-5 ratios against nginx (scripts/bench_ratios.py); nginx not installed, only the
# absolute figures.
#
# A load is named API-SIZE[-sse]-cN: API oa (OpenAI Chat), an (Anthropic), rs (OpenAI
# Responses), gm (Gemini); SIZE 8k, 200k, 2m (8.8 KB, 209 KB, 2 MB conversations); sse for
# a streamed answer; N connections each with a request in flight.
#
# Knobs (env): ROUNDS (3), DURATION (2.5 s measured per run), WARMUP (0.5 s), LOADS,
#   PEERS ("direct nginx loopwarden"), BENCH_WORK (/tmp/loopwarden-bench), LW_PORT (18090),
#   MOCK_DELAY_MS (5, between streamed events), BIN (a binary to measure instead of
#   building this checkout's), PGO=1 (measure scripts/build_pgo.sh's build, made first),
#   IDLE=0 (skip the idle-conversation memory check, scripts/idle_memory.py), IDLE_WAVES (12),
#   DRIVER (a load driver already built), MOCK_BIN (the binary whose `mock` is the upstream;
#   default BIN). PEERS may add `policies`: loopwarden again, with the ten policies of
#   scripts/bench_policies.toml (POLICIES to name another file), on LW_PORT + 1; and
#   `base`: another loopwarden binary (BASE_BIN), default config, on LW_PORT + 2, to
#   measure a change against the build before it in the same rotation; and `teamful`: the
#   ten policies with every team feature at work, on LW_PORT + 3: traces exported to a
#   sink that accepts them (a python one on LW_PORT + 4) and `/metrics` scraped every
#   second.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
LW_PORT=${LW_PORT:-18090}
MOCK_PORT=${MOCK_PORT:-18080}
NGINX_PORT=${NGINX_PORT:-18081}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-2.5}
WARMUP=${WARMUP:-0.5}
PEERS=${PEERS:-direct nginx loopwarden}
LOADS=${LOADS:-"oa-8k-c1 oa-8k-c16 oa-8k-c64 oa-200k-c1 oa-200k-c16 oa-200k-c64 oa-2m-c4
  oa-8k-sse-c1 oa-200k-sse-c1 oa-200k-sse-c16 oa-2m-sse-c4
  an-8k-c1 an-8k-sse-c1 an-200k-c1 an-200k-c16 an-200k-sse-c1 an-200k-sse-c16 an-2m-c4 an-2m-sse-c4
  rs-200k-sse-c16 gm-200k-sse-c16"}
case ${1:-} in
  --quick) ROUNDS=1; DURATION=1.5; WARMUP=0.3 ;;
  "") ;;
  *) sed -n '2,29p' "$0"; exit 2 ;;
esac
. "$ROOT/scripts/harness.sh"
say() { printf '[%(%H:%M:%S)T] bench: %s\n' -1 "$*" >&2; }

if [ -z "${BIN:-}" ] && [ "${PGO:-0}" = 1 ]; then
  say "building loopwarden (dist, profile-guided: scripts/build_pgo.sh)"
  BIN=$("$ROOT/scripts/build_pgo.sh")
fi
if [ -z "${BIN:-}" ]; then
  say "building loopwarden (dist)"
  (cd "$ROOT" && cargo build --profile dist --locked --bin loopwarden)
  BIN=$(cd "${CARGO_TARGET_DIR:-$ROOT/target}/dist" && pwd)/loopwarden
fi
[ -x "$BIN" ] || { say "no binary at $BIN"; exit 1; }
say "building the load driver and writing the request bodies"
harness_tools

STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$BENCH_WORK/results/$STAMP
DB=$BENCH_WORK/loopwarden-$STAMP.db
mkdir -p "$OUT"
RAW=$OUT/raw.jsonl
: >"$RAW"

declare -A URL PID
STARTED=()
# An OTLP/HTTP sink on port $1 that accepts every batch (what a collector answers), so
# that the `teamful` peer's exporter does its whole work: encode, send, read the answer.
start_trace_sink() {
  python3 - "$1" <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
  STARTED+=("$!")
}

# A Prometheus server's scrape of port $1's `/metrics`, every second, in the background.
scrape_metrics_every_second() {
  python3 - "$1" <<'PY' &
import sys, time, urllib.request
while True:
    time.sleep(1)
    try: urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read()
    except OSError: pass
PY
  STARTED+=("$!")
}

cleanup() { local p; for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start_mock "$MOCK_PORT" "${MOCK_BIN:-$BIN}"
STARTED+=("$MOCK_PID")
ACTIVE=()
for peer in $PEERS; do
  case $peer in
    direct) URL[direct]=http://127.0.0.1:$MOCK_PORT; PID[direct]= ;;
    nginx)
      command -v nginx >/dev/null || { say "nginx is not installed: measured without it"; continue; }
      mkdir -p "$BENCH_WORK/nginx/tmp"
      # A plain reverse proxy: keep-alive to the mock, nothing buffered (streams pass as
      # they come), large bodies in memory.
      cat >"$BENCH_WORK/nginx/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $BENCH_WORK/nginx/nginx.pid;
error_log $BENCH_WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $BENCH_WORK/nginx/tmp/body;
  proxy_temp_path $BENCH_WORK/nginx/tmp/proxy;
  client_max_body_size 64m;
  client_body_buffer_size 8m;
  keepalive_requests 1000000;
  upstream mock { server 127.0.0.1:$MOCK_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering on;
    }
  }
}
EOF
      nginx -p "$BENCH_WORK/nginx" -c "$BENCH_WORK/nginx/nginx.conf" -e "$BENCH_WORK/nginx/error.log" &
      PID[nginx]=$!
      STARTED+=("${PID[nginx]}")
      URL[nginx]=http://127.0.0.1:$NGINX_PORT
      wait_healthy "$NGINX_PORT" 50 0.1 / || { say "nginx did not start"; continue; } ;;
    loopwarden | policies | teamful | base)
      port=$LW_PORT db=$DB config=() bin=$BIN
      if [ "$peer" = policies ]; then
        port=$((LW_PORT + 1)) db=${DB%.db}-policies.db
        config=(--config "${POLICIES:-$ROOT/scripts/bench_policies.toml}")
      fi
      if [ "$peer" = teamful ]; then
        port=$((LW_PORT + 3)) db=${DB%.db}-teamful.db
        start_trace_sink $((LW_PORT + 4))
        { cat "${POLICIES:-$ROOT/scripts/bench_policies.toml}"
          printf '\n[telemetry]\notlp_endpoint = "http://127.0.0.1:%s"\n' $((LW_PORT + 4))
        } >"$BENCH_WORK/teamful.toml"
        config=(--config "$BENCH_WORK/teamful.toml")
      fi
      if [ "$peer" = base ]; then
        port=$((LW_PORT + 2)) db=${DB%.db}-base.db bin=${BASE_BIN:?BASE_BIN names the binary of the base peer}
      fi
      rm -f "$db" "$db-wal" "$db-shm"
      # Default config (or the ten policies): detection on, logging on. RUST_LOG=warn: what
      # a production deployment runs.
      # shellcheck disable=SC2046
      env $(upstream_env "http://127.0.0.1:$MOCK_PORT") RUST_LOG=${RUST_LOG:-warn} \
        "$bin" serve --listen "127.0.0.1:$port" --db "sqlite://$db" "${config[@]}" >"$OUT/$peer.log" 2>&1 &
      PID[$peer]=$!
      STARTED+=("${PID[$peer]}")
      URL[$peer]=http://127.0.0.1:$port
      wait_healthy "$port" || { say "$peer did not start: $(tail -3 "$OUT/$peer.log")"; exit 1; }
      [ "$peer" = teamful ] && scrape_metrics_every_second "$port" ;;
    *) say "unknown peer $peer"; exit 2 ;;
  esac
  ACTIVE+=("$peer")
done

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm); cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo || true)"
  echo "params: rounds=$ROUNDS duration=${DURATION}s warmup=${WARMUP}s mock_delay_ms=${MOCK_DELAY_MS:-5}"
  echo "peers: ${ACTIVE[*]}"
  echo "loopwarden: $BIN"
  command -v nginx >/dev/null && echo "nginx: $(nginx -v 2>&1)"
} >"$OUT/meta.txt"

# PAYLOAD CONCURRENCY of a load's name (API-SIZE[-sse]-cN).
load_parts() {
  local api size rest sse= c
  IFS=- read -r api size rest <<<"$1"
  [[ $rest == sse-* ]] && { sse=_stream; rest=${rest#sse-}; }
  c=${rest#c}
  case $api in oa) api=openai ;; an) api=anthropic ;; rs) api=responses ;; gm) api=gemini ;; esac
  echo "${api}_$size$sse.json $c"
}

for load in $LOADS; do
  read -r payload c <<<"$(load_parts "$load")"
  [ -f "$PAY/$payload" ] || { say "no payload $payload for load $load"; exit 2; }
  # shellcheck disable=SC2046
  checks=($(answer_checks "$payload"))
  for r in $(seq 1 "$ROUNDS"); do
    k=${#ACTIVE[@]}
    for i in $(seq 0 $((k - 1))); do
      peer=${ACTIVE[$(((i + r - 1) % k))]} # the order rotates every round
      pids=(--pid "mock=$MOCK_PID")
      [ -n "${PID[$peer]}" ] && pids+=(--pid "proxy=${PID[$peer]}")
      line=$("$DRIVER" --label "$peer|$load|$r" --url "${URL[$peer]}$(payload_path "$payload")" \
        --body "$PAY/$payload" -c "$c" --duration "$DURATION" --warmup "$WARMUP" \
        "${REQUEST_HEADERS[@]}" "${checks[@]}" "${pids[@]}" 2>>"$OUT/driver.err") || line=
      if [ -n "$line" ]; then
        echo "$line" >>"$RAW"
        say "$peer $load r$r: $(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print('%.1f rps, p50 %.3f ms, errors %d' % (d['rps'], d['lat_ms']['p50'] or 0, d['errors']))" "$line")"
      else
        say "$peer $load r$r: the driver failed (see $OUT/driver.err)"
      fi
    done
  done
done
cleanup
trap - EXIT

echo
python3 "$ROOT/scripts/bench_summary.py" "$OUT" | tee "$OUT/summary.md"
echo
python3 "$ROOT/scripts/bench_ratios.py" "$OUT" "$DB" | tee "$OUT/ratios.md"
for other in policies teamful base; do
  if [[ " ${ACTIVE[*]} " == *" $other "* ]]; then
    echo
    OURS=$other python3 "$ROOT/scripts/bench_ratios.py" "$OUT" "${DB%.db}-$other.db" | tee "$OUT/ratios-$other.md"
  fi
done
if [ "${IDLE:-1}" = 1 ]; then
  echo
  echo "### Memory kept per idle conversation"
  python3 "$ROOT/scripts/idle_memory.py" "$BIN" "${IDLE_CONVERSATIONS:-500}" "${IDLE_WAVES:-12}" \
    | tee "$OUT/idle_memory.txt"
fi
say "results in $OUT (raw.jsonl, summary.md, ratios.md); log $DB"
