# shellcheck shell=bash
# The load harness of the benchmark scripts (scripts/bench.sh, scripts/build_pgo.sh), all in
# this repository: the load driver (examples/loadgen.rs), the request bodies
# (scripts/bench_payloads.py: agent conversations of 8.8 KB, 209 KB and 2 MB in the four
# APIs) and the mock upstream (loopwarden's own, `loopwarden mock`, scripted to answer every
# request with a line of text and one tool call, streamed event by event when asked).
# Sourced; expects ROOT (this checkout) and BENCH_WORK (a scratch directory).

# Builds the load driver (release, into BENCH_TARGET_DIR, default /tmp/lw-bench-target),
# unless DRIVER names one already built, and writes the request bodies once into
# $BENCH_WORK/payloads. Sets DRIVER (the driver's path) and PAY (the bodies' directory).
harness_tools() {
  if [ -z "${DRIVER:-}" ]; then
    local target=${BENCH_TARGET_DIR:-/tmp/lw-bench-target}
    (cd "$ROOT" && CARGO_TARGET_DIR=$target cargo build --release --locked -q --example loadgen) >&2
    DRIVER=$target/release/examples/loadgen
  fi
  PAY=$BENCH_WORK/payloads
  [ -f "$PAY/gemini_2m_stream.json" ] || python3 "$ROOT/scripts/bench_payloads.py" "$PAY" >&2
}

# The path a payload is sent to, by its name: openai_ (Chat Completions), anthropic_
# (Messages), responses_ (OpenAI Responses), gemini_ (generateContent; a _stream one to
# streamGenerateContent, since a Gemini body does not say it streams).
payload_path() {
  case $1 in
    anthropic_*) echo /v1/messages ;;
    responses_*) echo /v1/responses ;;
    gemini_*_stream*) echo "/v1beta/models/bench-gemini:streamGenerateContent?alt=sse" ;;
    gemini_*) echo /v1beta/models/bench-gemini:generateContent ;;
    *) echo /v1/chat/completions ;;
  esac
}

# What every answer to a payload must hold (the driver's --expect and --marker): the
# mock's tool call, the stream's last event, and for streams the first token's text.
MOCK_TEXT="Reading the handler again."
answer_checks() {
  local end=
  case $1 in
    openai_*_stream*) end='[DONE]' ;;
    anthropic_*_stream*) end=message_stop ;;
    responses_*_stream*) end=response.completed ;;
    gemini_*_stream*) end=finishReason ;;
  esac
  echo "--expect read_file"
  [ -n "$end" ] && echo "--expect $end --marker Reading"
  return 0
}

# Waits until a server answers on 127.0.0.1:PORT at PATH (default /healthz): up to TRIES
# tries (default 50), DELAY seconds apart (default 0.1). Fails when it never does.
wait_healthy() {
  local port=$1 tries=${2:-50} delay=${3:-0.1} path=${4:-/healthz}
  for _ in $(seq 1 "$tries"); do
    curl -s -o /dev/null "http://127.0.0.1:$port$path" 2>/dev/null && return 0
    sleep "$delay"
  done
  return 1
}

# The headers of every request the scripts send: a dummy key in each API's key header, and
# the version header Anthropic requires.
REQUEST_HEADERS=(-H "authorization: Bearer sk-bench" -H "x-api-key: sk-bench"
  -H "x-goog-api-key: sk-bench" -H "anthropic-version: 2023-06-01")

# The proxy's environment for one upstream at URL, for `env`: every API's base URL.
upstream_env() {
  echo "LOOPWARDEN_OPENAI_BASE_URL=$1 LOOPWARDEN_ANTHROPIC_BASE_URL=$1 LOOPWARDEN_GEMINI_BASE_URL=$1"
}

# Starts the mock upstream (BIN's `mock`) on 127.0.0.1:PORT and sets MOCK_PID. Every answer
# is the same turn: a line of text and one tool call, in the API of the request, streamed
# with MOCK_DELAY_MS (default 5) between events when the request asks for a stream.
start_mock() {
  local port=$1 bin=$2
  local script=$BENCH_WORK/mock-script.json
  mkdir -p "$BENCH_WORK"
  cat >"$script" <<JSON
{"turns": [{"text": "$MOCK_TEXT",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "src/sse/handlers.rs"}}]}],
 "after_end": "repeat_last", "chunk_delay_ms": ${MOCK_DELAY_MS:-5}}
JSON
  "$bin" mock --listen "127.0.0.1:$port" --script "$script" >/dev/null 2>&1 &
  MOCK_PID=$!
  wait_healthy "$port" 50 0.1 / || { echo "harness: the mock did not start" >&2; return 1; }
}
