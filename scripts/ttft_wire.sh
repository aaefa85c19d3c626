#!/usr/bin/env bash
# A bench run of the stream loads with every loopback packet of it captured, then split by
# scripts/ttft_wire.py into where each window's first tokens waited:
#
#   scripts/ttft_wire.sh                                  # the two 2 MB streams, harness windows
#   LOADS="an-200k-sse-c16" ROUNDS=6 scripts/ttft_wire.sh # any knob of scripts/bench.sh
#
# Needs root and tcpdump (apt-get install tcpdump). The capture (headers and the first
# ~250 bytes of each packet) goes to $CAP, on tmpfs so that writing it does not touch the
# disk the proxy logs to; tcpdump's own CPU is spent beside every peer alike.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CAP=${CAP:-/dev/shm/lw-ttft-wire.pcap}
LW_PORT=${LW_PORT:-18090}
NGINX_PORT=18081 MOCK_PORT=18080  # fixed in the harness's run.sh
command -v tcpdump >/dev/null || { echo "ttft_wire: needs tcpdump (apt-get install tcpdump)" >&2; exit 1; }
tcpdump -i lo -s 320 -B 262144 --time-stamp-precision=nano -w "$CAP" \
  "tcp port $LW_PORT or tcp port $NGINX_PORT or tcp port $MOCK_PORT" 2>"$CAP.log" &
TCPDUMP=$!
trap 'kill $TCPDUMP 2>/dev/null || true' EXIT
sleep 1
LOADS=${LOADS:-"oa-2m-sse-c4 an-2m-sse-c4"} IDLE=0 LW_PORT=$LW_PORT "$ROOT/scripts/bench.sh" "$@"
kill -INT $TCPDUMP
wait $TCPDUMP || true
cat "$CAP.log" >&2
python3 "$ROOT/scripts/ttft_wire.py" "$CAP" "$LW_PORT" "$NGINX_PORT" "$MOCK_PORT"
