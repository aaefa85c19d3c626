# shellcheck shell=bash
# What the benchmark scripts share about the side-by-side harness (../shared/bench): where it
# is, and its mock upstream, load driver and payloads for scripts that drive the proxy
# without the harness's run.sh (scripts/build_pgo.sh), with the paths of the four APIs and
# loopwarden's own mock for the two the harness's does not speak. Sourced; expects ROOT
# (this checkout) and, for harness_tools and start_mock, BENCH_WORK.

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
# generates its payloads once into $BENCH_WORK/payloads, with the same conversations as
# OpenAI Responses and Gemini bodies beside them (scripts/api_payloads.py). Sets HARNESS_BIN
# (the directory of the two binaries) and PAY (the payloads').
harness_tools() {
  find_harness
  local target=${BENCH_TARGET_DIR:-${HARNESS_TARGET:-/tmp/lw-bench-target}}
  (cd "$BENCH_HARNESS" && CARGO_TARGET_DIR=$target cargo build --release -q)
  HARNESS_BIN=$target/release
  PAY=$BENCH_WORK/payloads
  [ -f "$PAY/anthropic_2m_stream.json" ] || python3 "$BENCH_HARNESS/gen_payloads.py" "$PAY" >&2
  [ -f "$PAY/gemini_2m_stream.json" ] || python3 "$ROOT/scripts/api_payloads.py" "$PAY" >&2
}

# The path a payload of harness_tools is sent to, by its name: openai_ (Chat Completions),
# anthropic_ (Messages), responses_ (OpenAI Responses), gemini_ (generateContent; a _stream
# one to streamGenerateContent, since a Gemini body does not say it streams).
payload_path() {
  case $1 in
    anthropic_*) echo /v1/messages ;;
    responses_*) echo /v1/responses ;;
    gemini_*_stream*) echo "/v1beta/models/bench-gemini:streamGenerateContent?alt=sse" ;;
    gemini_*) echo /v1beta/models/bench-gemini:generateContent ;;
    *) echo /v1/chat/completions ;;
  esac
}

# Waits until a proxy answers /healthz on 127.0.0.1:PORT: up to TRIES tries (default 50),
# DELAY seconds apart (default 0.1). Fails when it never does.
wait_healthy() {
  local port=$1 tries=${2:-50} delay=${3:-0.1}
  for _ in $(seq 1 "$tries"); do
    curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
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

# Starts a mock upstream on 127.0.0.1:PORT that answers PAYLOAD's API, and sets MOCK_PID.
# OpenAI Chat and Anthropic get the harness's mock (`mockup`), paced as scripts/bench.sh
# runs it. OpenAI Responses and Gemini, which it does not speak, get loopwarden's own
# (`BIN mock`), scripted to answer every request as the harness's does: a line of text and
# one tool call. Needs harness_tools first.
start_mock() {
  local payload=$1 port=$2 bin=$3
  case $payload in
    openai_* | anthropic_*)
      MOCK_ADDR=127.0.0.1:$port MOCK_DELAY_MS=5 MOCK_CHUNKS=20 MOCK_LATENCY_MS=0 \
        "$HARNESS_BIN/mockup" >/dev/null 2>&1 &
      ;;
    *)
      local script=$BENCH_WORK/lw-mock-script.json
      cat >"$script" <<'JSON'
{"turns": [{"text": "Reading the handler again.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "src/sse/handlers.rs"}}]}],
 "after_end": "repeat_last"}
JSON
      "$bin" mock --listen "127.0.0.1:$port" --script "$script" >/dev/null 2>&1 &
      ;;
  esac
  MOCK_PID=$!
}
