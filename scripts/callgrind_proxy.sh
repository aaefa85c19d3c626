#!/usr/bin/env bash
# Instructions per request of the whole proxy (every thread: the request path, the log
# writer, SQLite), under callgrind: noise-free, so two builds compare on a busy machine.
#
#   scripts/callgrind_proxy.sh [BIN ...]          # oa-8k: openai_8k.json, 50 then 550 requests
#                                                 # (no BIN: target/dist/loopwarden, the
#                                                 # benchmarks' profile: cargo build --profile dist)
#   PAYLOAD=anthropic_8k_stream.json API_PATH=/v1/messages N1=20 N2=220 scripts/callgrind_proxy.sh BIN
#   CONFIG=some.toml scripts/callgrind_proxy.sh BIN    # serve with that config file
#   ROUNDS=5 scripts/callgrind_proxy.sh BIN_A BIN_B    # 5 interleaved rounds: the median, and each
#
# Each binary serves a fresh SQLite log in front of its own `loopwarden mock`; a client sends
# the same body N1 times, then (in a second run) N2 times, over one kept-alive connection.
# The difference of the two totals over N2 - N1 is the marginal cost of a request, start-up
# excluded. Prints one line per binary. The callgrind.out files stay in $CALLGRIND_OUT
# (default /tmp/loopwarden-callgrind-proxy) for callgrind_annotate. Note that callgrind counts
# each byte a `rep movsb` copies as an instruction: a large memcpy weighs more here than in time.
# A run moves by up to 3-4 % with the log writer's batches (how many requests each takes
# depends on timing): compare medians of a few rounds (ROUNDS), the builds taking turns.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CALLGRIND_OUT:-/tmp/loopwarden-callgrind-proxy}
PAYLOAD=${PAYLOAD:-openai_8k.json}
API_PATH=${API_PATH:-/v1/chat/completions}
N1=${N1:-50} N2=${N2:-550} ROUNDS=${ROUNDS:-1}
MOCK_PORT=${MOCK_PORT:-18180} LW_PORT=${LW_PORT:-18190}
command -v valgrind >/dev/null || { echo "callgrind_proxy: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
source "$ROOT/scripts/harness.sh"
[ $# -gt 0 ] || set -- "${CARGO_TARGET_DIR:-$ROOT/target}/dist/loopwarden"
for bin in "$@"; do
  [ -x "$bin" ] || { echo "callgrind_proxy: no binary at $bin (cargo build --profile dist)" >&2; exit 1; }
done
mkdir -p "$OUT"
PAY=$OUT/payloads
[ -f "$PAY/$PAYLOAD" ] || python3 "$ROOT/scripts/bench_payloads.py" "$PAY" >&2

# One run: BIN serves N requests under callgrind; prints the total instructions.
run() {
  local bin=$1 n=$2 dir=$3
  rm -rf "$dir" && mkdir -p "$dir"
  BENCH_WORK=$dir MOCK_DELAY_MS=0 start_mock "$MOCK_PORT" "$bin"
  env $(upstream_env "http://127.0.0.1:$MOCK_PORT") valgrind --tool=callgrind \
    --callgrind-out-file="$dir/callgrind.out" "$bin" serve ${CONFIG:+--config "$CONFIG"} --listen "127.0.0.1:$LW_PORT" \
    --db "sqlite://$dir/log.db" >"$dir/serve.log" 2>&1 &
  local proxy=$!
  wait_healthy "$LW_PORT" 300 0.2 || { echo "callgrind_proxy: the proxy did not start" >&2; exit 1; }
  python3 - "$LW_PORT" "$API_PATH" "$PAY/$PAYLOAD" "$n" <<'PY'
import http.client, sys
port, path, body, n = int(sys.argv[1]), sys.argv[2], open(sys.argv[3], "rb").read(), int(sys.argv[4])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
headers = {"authorization": "Bearer sk-bench", "x-api-key": "sk-bench",
           "anthropic-version": "2023-06-01", "content-type": "application/json"}
for _ in range(n):
    conn.request("POST", path, body=body, headers=headers)
    answer = conn.getresponse()
    if answer.status != 200 or b"read_file" not in answer.read():
        sys.exit(f"callgrind_proxy: unexpected answer {answer.status}")
PY
  kill -INT "$proxy"; wait "$proxy" || true
  kill "$MOCK_PID" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$dir/callgrind.out"
}

declare -A runs
for _ in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    tag=$(echo "$bin" | tr '/' '_')
    first=$(run "$bin" "$N1" "$OUT/$tag-$N1")
    second=$(run "$bin" "$N2" "$OUT/$tag-$N2")
    runs[$bin]+="$(( (second - first) / (N2 - N1) )) "
  done
done
printf '%-50s %12s\n' "binary ($PAYLOAD)" instructions/request
for bin in "$@"; do
  sorted=$(tr ' ' '\n' <<<"${runs[$bin]}" | sed '/^$/d' | sort -n)
  median=$(sed -n "$(( (ROUNDS + 1) / 2 ))p" <<<"$sorted")
  if [ "$ROUNDS" -gt 1 ]; then
    printf '%-50s %12d   (runs: %s)\n' "$bin" "$median" "$(echo ${runs[$bin]})"
  else
    printf '%-50s %12d\n' "$bin" "$median"
  fi
done
