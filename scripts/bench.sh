#!/usr/bin/env bash
# Load benchmark of loopwarden beside a direct connection and nginx (issue 5), one command:
#
#   scripts/bench.sh                 # 3 interleaved rounds, every load (~12 min on 2 cores)
#   scripts/bench.sh --quick         # 1 round, short windows (~4 min)
#   ROUNDS=5 PEERS="direct nginx litellm" scripts/bench.sh   # any knob of the harness
#
# It builds loopwarden in release, runs the side-by-side harness (../shared/bench/run.sh:
# a Rust mock upstream, a closed-loop driver that measures each proxy's CPU and memory)
# with loopwarden as the proxy under test (detection and logging on, default config, a
# fresh SQLite log), then prints the harness's tables and the issue-5 ratios against nginx
# (scripts/bench_ratios.py). nginx is skipped when it is not installed; the ratios then
# cannot be computed and only the absolute figures are printed.
#
# The harness is copied to $BENCH_WORK/harness (it writes payloads and results beside
# itself); results land in $BENCH_WORK/results/<stamp>/. Knobs (env):
#   BENCH_HARNESS   the harness directory (default: ../shared/bench next to the repo, else /work/shared/bench)
#   BENCH_WORK      scratch directory (default /tmp/loopwarden-bench)
#   LW_PORT         loopwarden's port (default 18090)
#   EXTRA=0         only the harness's own loads (default adds the missing size/stream/API combinations)
#   IDLE=0          skip the idle-conversation memory check (scripts/idle_memory.py) at the end
#   IDLE_WAVES=12   its waves of 500 new conversations (RSS after each; it levels off by ~12)
#   BIN             a loopwarden binary to measure instead of building this checkout's
#   PGO=1           measure the production build of scripts/build_pgo.sh (built first)
# and every knob of run.sh (PEERS, ROUNDS, DURATION, WARMUP, LOADS, PIN, MOCK_*).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
LW_PORT=${LW_PORT:-18090}
EXTRA=${EXTRA:-1}
. "$ROOT/scripts/harness.sh"
find_harness
export PEERS=${PEERS:-direct nginx}

if [ -z "${BIN:-}" ] && [ "${PGO:-0}" = 1 ]; then
  echo "bench: building loopwarden (release, profile-guided: scripts/build_pgo.sh)" >&2
  BIN=$("$ROOT/scripts/build_pgo.sh")
fi
if [ -z "${BIN:-}" ]; then
  echo "bench: building loopwarden (release)" >&2
  (cd "$ROOT" && cargo build --release --locked --bin loopwarden)
  TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
  BIN=$(cd "$TARGET_DIR/release" && pwd)/loopwarden
else
  BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")  # the harness runs it from elsewhere
fi
[ -x "$BIN" ] || { echo "bench: no binary at $BIN" >&2; exit 1; }

# A writable copy of the harness (it writes payloads/ and results/ beside run.sh); its own
# build goes to its own target dir, not ours.
H=$BENCH_WORK/harness
mkdir -p "$H"
cp -r "$BENCH_HARNESS/." "$H/"
chmod -R u+w "$H"
if [ "$EXTRA" = 1 ]; then
  # The harness's loads leave out some combinations issue 5 asks about: add them after its
  # last load line (left as is if that line ever changes).
  python3 - "$H/run.sh" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
anchor = "an-200k-sse-c16 anthropic anthropic_200k_stream.json  16\n"
extra = """oa-8k-sse-c1    openai    openai_8k_stream.json       1
oa-2m-sse-c4    openai    openai_2m_stream.json       4
an-8k-c1        anthropic anthropic_8k.json           1
an-8k-sse-c1    anthropic anthropic_8k_stream.json    1
an-200k-c1      anthropic anthropic_200k.json         1
an-200k-sse-c1  anthropic anthropic_200k_stream.json  1
an-2m-c4        anthropic anthropic_2m.json           4
an-2m-sse-c4    anthropic anthropic_2m_stream.json    4
oa-200k-c64     openai    openai_200k.json            64
"""
if anchor in s and extra not in s:
    s = s.replace(anchor, anchor + extra)
    open(p, "w").write(s)
else:
    print("bench: harness load table changed; running its own loads only", file=sys.stderr)
PY
fi

STAMP=$(date +%Y%m%d-%H%M%S)
export OUT=$BENCH_WORK/results/$STAMP
DB=$BENCH_WORK/loopwarden-$STAMP.db
mkdir -p "$OUT"
rm -f "$DB" "$DB-wal" "$DB-shm"
export CARGO_TARGET_DIR=${BENCH_TARGET_DIR:-/tmp/lw-bench-target}
export PROXY_NAME=loopwarden
export PROXY_URL=http://127.0.0.1:$LW_PORT
# Default config: detection on, logging on. RUST_LOG=warn: what a production deployment runs.
export PROXY_CMD="LOOPWARDEN_OPENAI_BASE_URL=\$UPSTREAM_URL LOOPWARDEN_ANTHROPIC_BASE_URL=\$UPSTREAM_URL RUST_LOG=\${RUST_LOG:-warn} exec '$BIN' serve --listen 127.0.0.1:$LW_PORT --db 'sqlite://$DB'"

"$H/run.sh" "$@"
echo
python3 "$ROOT/scripts/bench_ratios.py" "$OUT" | tee "$OUT/ratios.md"
if [ "${IDLE:-1}" = 1 ] && [ -x "$CARGO_TARGET_DIR/release/mockup" ]; then
  echo
  echo "### Memory kept per idle conversation"
  python3 "$ROOT/scripts/idle_memory.py" "$BIN" "$CARGO_TARGET_DIR/release/mockup" "${IDLE_CONVERSATIONS:-500}" \
    "${IDLE_WAVES:-12}" \
    | tee "$OUT/idle_memory.txt"
fi
echo "bench: results in $OUT (raw.jsonl, summary.md, ratios.md); log $DB" >&2
