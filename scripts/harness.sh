# shellcheck shell=bash
# What the benchmark scripts share about the side-by-side harness (../shared/bench): where it
# is, and its mock upstream, load driver and payloads for the scripts that drive the proxy
# without the harness's run.sh (scripts/cpu_per_thread.sh, scripts/build_pgo.sh). Sourced;
# expects ROOT (this checkout) and, for harness_tools, BENCH_WORK.

# Sets BENCH_HARNESS, unless given, to the harness next to the repo (or /work/shared/bench);
# exits when there is none.
find_harness() {
  if [ -z "${BENCH_HARNESS:-}" ]; then
    local d
    for d in "$ROOT/../shared/bench" /work/shared/bench; do
      [ -x "$d/run.sh" ] && { BENCH_HARNESS=$(cd "$d" && pwd); break; }
    done
  fi
  [ -n "${BENCH_HARNESS:-}" ] && [ -x "$BENCH_HARNESS/run.sh" ] || {
    echo "$(basename "$0"): no harness found; set BENCH_HARNESS to the directory holding run.sh" >&2
    exit 1
  }
}

# Builds the harness's mock upstream (`mockup`) and load driver (`benchdrv`) into their own
# target dir (BENCH_TARGET_DIR, or HARNESS_TARGET, default /tmp/lw-bench-target) and
# generates its payloads once into $BENCH_WORK/payloads. Sets HARNESS_BIN (the directory
# of the two binaries) and PAY (the payloads').
harness_tools() {
  find_harness
  local target=${BENCH_TARGET_DIR:-${HARNESS_TARGET:-/tmp/lw-bench-target}}
  (cd "$BENCH_HARNESS" && CARGO_TARGET_DIR=$target cargo build --release -q)
  HARNESS_BIN=$target/release
  PAY=$BENCH_WORK/payloads
  [ -f "$PAY/anthropic_2m_stream.json" ] || python3 "$BENCH_HARNESS/gen_payloads.py" "$PAY" >&2
}
