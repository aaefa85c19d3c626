#!/usr/bin/env bash
# Instructions per request of the whole proxy (serving threads, log thread, hyper, tokio,
# SQLite) under a real load, counted by callgrind: noise-free, so a before/after holds on a
# busy machine, unlike a load run's timings.
#
#   scripts/callgrind_proxy.sh                       # openai_8k.json, 2000 requests at c16
#   scripts/callgrind_proxy.sh anthropic_8k.json 500
#
# The release proxy runs under valgrind against the load harness's mock upstream and is
# driven by the harness's load driver: 300 requests of warm-up, counters zeroed, then N
# requests (or as many as DURATION seconds allow, default 120: the driver stops sending
# after N but waits out its window). Prints the instructions per request counted over the
# requests done; the profile (one file per process part)
# stays in $CALLGRIND_OUT for `callgrind_annotate --inclusive=yes`.
#
# PAYLOAD is any of scripts/harness.sh's (the four APIs; Responses and Gemini requests go
# to loopwarden's own mock). Needs valgrind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAYLOAD=${1:-openai_8k.json}
N=${2:-2000}
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
OUTDIR=${CALLGRIND_OUT:-/tmp/loopwarden-callgrind}
MOCK_PORT=${MOCK_PORT:-19971}
LW_PORT=${LW_PORT:-19972}
command -v valgrind >/dev/null || { echo "callgrind_proxy: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
. "$ROOT/scripts/harness.sh"
harness_tools
[ -e "$PAY/$PAYLOAD" ] || { echo "callgrind_proxy: no payload $PAY/$PAYLOAD" >&2; exit 1; }
(cd "$ROOT" && cargo build --release --locked --bin loopwarden)
BIN=$(cd "${CARGO_TARGET_DIR:-$ROOT/target}/release" && pwd)/loopwarden
API=$(payload_path "$PAYLOAD")
mkdir -p "$OUTDIR"
OUT=$OUTDIR/callgrind.out.proxy.${PAYLOAD%.json}
rm -f "$OUT" "$OUT".*
WORK=$(mktemp -d)
cleanup() { kill "${LP:-}" "${MOCK_PID:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

start_mock "$PAYLOAD" "$MOCK_PORT" "$BIN"
# shellcheck disable=SC2046
env $(upstream_env "http://127.0.0.1:$MOCK_PORT") RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$OUT" --separate-threads=no \
  "$BIN" serve --listen 127.0.0.1:$LW_PORT --db "sqlite://$WORK/log.db" >/dev/null 2>"$WORK/valgrind.log" &
LP=$!
# Under valgrind the proxy takes seconds to start.
wait_healthy $LW_PORT 100 0.2 || true
drive() {
  "$HARNESS_BIN/benchdrv" --url "http://127.0.0.1:$LW_PORT$API" --body "$PAY/$PAYLOAD" \
    -c 16 --requests "$1" --duration "$2" --warmup 0 "${REQUEST_HEADERS[@]}"
}
drive 300 30 >/dev/null 2>&1
callgrind_control -z "$LP" >/dev/null 2>&1
drive "$N" "${DURATION:-120}" >"$WORK/load.json" 2>/dev/null
sleep 1 # the log thread's last batch
callgrind_control -d "$LP" >/dev/null 2>&1
done=$(python3 -c "import json; print(json.load(open('$WORK/load.json'))['requests'])")
total=$(awk '/^(summary|totals):/ {print $2; exit}' "$OUT".1)
echo "$PAYLOAD: $done requests, $total instructions, $((total / done)) per request"
echo "profile: $OUT.1 (callgrind_annotate --inclusive=yes $OUT.1 | head -60)"
