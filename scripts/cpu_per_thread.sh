#!/usr/bin/env bash
# The proxy's CPU per request, split by thread, over a fixed number of requests against the
# harness's mock upstream: a fresh loopwarden and mock per round, CPU read from /proc per
# thread before and after. Steadier than timed windows on a shared machine, and it shows
# which thread pays (the serving threads `loopwarden`/`loopwarden-serve-N`, the log thread
# `loopwarden-log`). BENCHMARKS.md's "The log thread", "Serving threads" and "Connections
# spread" sections were measured with it.
#
#   scripts/cpu_per_thread.sh PAYLOAD CONCURRENCY [REQUESTS] [ROUNDS]
#   scripts/cpu_per_thread.sh openai_8k.json 64 20000 3
#
# PAYLOAD: a file scripts/harness.sh generates (openai_|anthropic_|responses_|gemini_ +
# 8k|200k|2m [+ _stream] .json). The harness's mock answers the first two APIs; Responses and
# Gemini requests go to loopwarden's own mock (`$BIN mock`, scripted to answer as the harness's).
# Env: BIN (default: this checkout's release build, built if missing), BENCH_HARNESS (as in
# scripts/bench.sh), BENCH_WORK (default /tmp/loopwarden-bench), EXTRA="K=V ..." extra
# environment for the proxy.
set -euo pipefail
PF=${1:?payload file name}; C=${2:?concurrency}; N=${3:-20000}; R=${4:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
. "$ROOT/scripts/harness.sh"
if [ -z "${BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release --locked --bin loopwarden -q)
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/loopwarden
fi
harness_tools
URLPATH=$(payload_path "$PF")
MOCK_PORT=19961; PROXY_PORT=19962
UP=http://127.0.0.1:$MOCK_PORT

for _ in $(seq 1 "$R"); do
  start_mock "$PF" $MOCK_PORT "$BIN"
  D=$(mktemp -d)
  # shellcheck disable=SC2086,SC2046
  env ${EXTRA:-} $(upstream_env "$UP") RUST_LOG=warn \
    "$BIN" serve --listen 127.0.0.1:$PROXY_PORT --db "sqlite://$D/log.db" >/dev/null 2>&1 & PROXY=$!
  sleep 1
  drive() {  # drive REQUESTS SECONDS_CAP [more benchdrv args]
    local n=$1 cap=$2; shift 2
    "$HARNESS_BIN/benchdrv" --url "http://127.0.0.1:$PROXY_PORT$URLPATH" --body "$PAY/$PF" -c "$C" \
      --requests "$n" --duration "$cap" --warmup 0 "${REQUEST_HEADERS[@]}" "$@"
  }
  drive 2000 2 >/dev/null 2>&1   # warm: connections open, the conversation read once
  snap() { for t in /proc/$PROXY/task/*; do echo "$(cat "$t/comm") $(awk '{print $14+$15}' "$t/stat")"; done; }
  snap >"$D/before"
  # benchdrv runs until its duration even once the requests are done: cap it near their time.
  drive "$N" $((N / 2500 + 2)) --pid proxy=$PROXY >"$D/run.json" 2>/dev/null
  sleep 0.3   # the log thread's last batch
  snap >"$D/after"
  python3 - "$D" <<'PY'
import collections, json, os, sys
d = sys.argv[1]
hz = os.sysconf("SC_CLK_TCK")
def ticks(name):
    c = collections.Counter()
    for line in open(os.path.join(d, name)):
        thread, value = line.rsplit(" ", 1)
        c[thread.strip()] += int(value)
    return c
before, after = ticks("before"), ticks("after")
run = json.load(open(os.path.join(d, "run.json")))
n = run["requests"]
per = {t: (after[t] - before.get(t, 0)) * 1e6 / hz / n for t in after}
threads = " ".join(f"{t}={v:.1f}" for t, v in sorted(per.items(), key=lambda x: -x[1]) if v > 0.05)
errors = f"  {run['errors']} ERRORS" if run["errors"] else ""
print(f"{n} requests{errors}  {run['rps']:.0f}/s  p50 {run['lat_ms']['p50']:.3f} ms  "
      f"cpu {sum(per.values()):.1f} µs/request [{threads}]  "
      f"peak RSS {run['procs']['proxy']['rss_peak_kb'] / 1024:.1f} MB  other {run['machine']['foreign_pct']:.0f}%")
PY
  kill "$PROXY" "$MOCK_PID"; wait "$PROXY" "$MOCK_PID" 2>/dev/null || true
  rm -rf "$D"
done
