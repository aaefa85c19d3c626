#!/usr/bin/env bash
# Where the kernel ran a bench run's three processes (the driver, the proxy, the mock), read
# from the scheduler's own trace:
#
#   scripts/sched_placement.sh                        # the 8.8 KB loads at c1, harness windows
#   LOADS="oa-8k-c1" ROUNDS=5 scripts/sched_placement.sh   # any knob of scripts/bench.sh
#
# At concurrency 1 a request passes driver -> proxy -> mock -> proxy -> driver, and each
# arrow wakes a process. On two CPUs, a process woken on the CPU its waker is about to leave
# runs within a few µs; one woken on the other CPU, idle by then, waits for that CPU to wake
# up, ~40–50 µs on this virtual machine. So the added latency at c1 depends on which
# processes share a CPU, which the kernel decides at each wake-up (BENCHMARKS.md, "Session
# 21"). scripts/sched_placement.py classifies every request of every proxy window by where
# the proxy woke the mock and the driver, and prints how long each kind of request took.
#
# Needs root and tracefs (/sys/kernel/tracing). Only two scheduler events are traced
# (sched_waking, sched_switch), into a per-CPU ring buffer of $BUF_KB KiB; the text trace
# goes to $TRACE, on tmpfs (~150 MB for the default loads).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=/sys/kernel/tracing
TRACE=${TRACE:-/dev/shm/lw-sched-placement.trace}
BUF_KB=${BUF_KB:-262144}
[ -w "$T/trace" ] || { echo "sched_placement: needs root and tracefs at $T" >&2; exit 1; }

# The ring buffer is kernel memory ($BUF_KB KiB per CPU): given back on exit, as are the
# events and the overwrite option.
OLD_BUF_KB=$(cat "$T/buffer_size_kb")
OLD_OVERWRITE=$(cat "$T/options/overwrite")
stop_tracing() {
  echo 0 > "$T/tracing_on"
  echo > "$T/set_event"
  echo > "$T/trace"
  echo "$OLD_OVERWRITE" > "$T/options/overwrite"
  echo "$OLD_BUF_KB" > "$T/buffer_size_kb"
}
trap stop_tracing EXIT
echo 0 > "$T/tracing_on"
echo > "$T/trace"
echo "$BUF_KB" > "$T/buffer_size_kb"
# Stop at a full buffer rather than overwrite the run's first windows.
echo 0 > "$T/options/overwrite"
printf 'sched:sched_waking\nsched:sched_switch\n' > "$T/set_event"
echo 1 > "$T/tracing_on"
LOADS=${LOADS:-"oa-8k-c1 an-8k-c1"} IDLE=0 "$ROOT/scripts/bench.sh" "$@"
echo 0 > "$T/tracing_on"
cat "$T/trace" > "$TRACE"
stop_tracing
python3 "$ROOT/scripts/sched_placement.py" "$TRACE"
