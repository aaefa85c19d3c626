#!/usr/bin/env bash
# The end-to-end suite with real agents (see tests/e2e/e2e.py for what it checks).
#   tests/e2e/run.sh [--clients claude,codex,gemini,opencode,mini-swe-agent] [--scenarios control,loop,teams] [--direct]
# Agents are installed from their registries into $LW_AGENT_CACHE (default /tmp/lw-agents) on
# first use; run output goes to $LW_E2E_OUT (default /tmp/lw-e2e). LOOPWARDEN_BIN skips the build.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [[ -z "${LOOPWARDEN_BIN:-}" ]]; then
  (cd "$root" && cargo build --quiet --bin loopwarden)
  LOOPWARDEN_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/loopwarden"
fi
export LOOPWARDEN_BIN
exec python3 "$here/e2e.py" "$@"
