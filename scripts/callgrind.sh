#!/usr/bin/env bash
# Instruction counts of the per-request path (benches/instructions.rs) under callgrind:
# noise-free, so before/after comparisons hold on a busy machine.
#
#   scripts/callgrind.sh                 # every scenario
#   scripts/callgrind.sh warm/openai/2MB growth/anthropic/300
#
# Prints one line per scenario: instructions (Ir) spent inside the measured call.
# Keeps the callgrind.out files in $CALLGRIND_OUT (default /tmp/loopwarden-callgrind) for
# callgrind_annotate.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${CALLGRIND_OUT:-/tmp/loopwarden-callgrind}
command -v valgrind >/dev/null || { echo "callgrind: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
mkdir -p "$OUTDIR"
BIN=$(cd "$ROOT" && cargo bench --bench instructions --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "instructions":
        print(m["executable"])')
[ -x "$BIN" ] || { echo "callgrind: could not build benches/instructions.rs" >&2; exit 1; }
if [ $# -eq 0 ]; then set -- $("$BIN" list); fi
printf '%-28s %15s\n' scenario instructions
for s in "$@"; do
  f=$OUTDIR/callgrind.out.${s//\//_}
  valgrind --tool=callgrind --callgrind-out-file="$f" --collect-atstart=no \
    --toggle-collect='*measured*' "$BIN" "$s" >/dev/null 2>&1
  printf '%-28s %15s\n' "$s" "$(awk '/^(summary|totals):/ {print $2; exit}' "$f")"
done
