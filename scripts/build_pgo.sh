#!/usr/bin/env bash
# A `dist` build of loopwarden laid out by the profile of a real load (profile-guided
# optimization), for production:
#
#   scripts/build_pgo.sh          # prints the binary's path ($PGO_TARGET_DIR/use/dist/loopwarden)
#
# Why: at low concurrency the proxy's own code runs cold (the agent, the model API and the
# kernel have run on its CPU since its last request), at about one instruction every two
# cycles, spread thin over hyper, tokio, the handler and the allocator (BENCHMARKS.md,
# "Where it stands"). PGO puts the code a request runs together and the rest aside, which
# is what cold code pays for (12–27 % less CPU per 8.8 KB request at c1).
#
# Steps:
#   1. an instrumented dist build (-Cprofile-generate) into $PGO_TARGET_DIR/gen;
#   2. training: that binary, with its default config (detection and logging on), driven
#      by the repository's load harness (scripts/harness.sh: examples/loadgen.rs, the
#      bodies of scripts/bench_payloads.py, loopwarden's own mock upstream) over the
#      request shapes of scripts/bench.sh (8.8 KB, 209 KB and 2 MB conversations; plain
#      and streamed; concurrency 1 to 16) in the four APIs, about two minutes; it then
#      stops on SIGTERM, which writes its profile;
#   3. the profile merged with llvm-profdata (rustup's `llvm-tools` component, added if
#      missing);
#   4. the dist build with -Cprofile-use into $PGO_TARGET_DIR/use.
# The code is the same as `cargo build --profile dist`'s; only its layout and inlining differ.
# The interventions' paths (a nudge, a halt) run code the training does not reach, which
# PGO treats as cold: they are rare by design, a few per run.
#
# Nothing outside this repository is needed but rustup's component.
#
# Knobs (env): PGO_TARGET_DIR (default target/pgo), BENCH_WORK / BENCH_TARGET_DIR (the load
# driver's build) as in scripts/bench.sh, TRAIN_SECONDS per load (default 3).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PGO_TARGET_DIR=${PGO_TARGET_DIR:-$ROOT/target/pgo}
BENCH_WORK=${BENCH_WORK:-/tmp/loopwarden-bench}
TRAIN_SECONDS=${TRAIN_SECONDS:-3}
MOCK_PORT=${MOCK_PORT:-19991}
LW_PORT=${LW_PORT:-19992}
say() { echo "build_pgo: $*" >&2; }

# The load driver and the request bodies.
. "$ROOT/scripts/harness.sh"
harness_tools

# llvm-profdata of the toolchain that builds: its profile format is the compiler's.
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata
if [ ! -x "$PROFDATA" ]; then
  say "adding rustup's llvm-tools component (llvm-profdata)"
  rustup component add llvm-tools >&2
fi

PROFILES=$PGO_TARGET_DIR/profiles
rm -rf "$PROFILES"
mkdir -p "$PROFILES"
say "1/4 instrumented build"
(cd "$ROOT" && CARGO_TARGET_DIR=$PGO_TARGET_DIR/gen \
  RUSTFLAGS="-Cprofile-generate=$PROFILES" cargo build --profile dist --locked --bin loopwarden >&2)
# Build scripts are instrumented too and leave profiles of their own: only the proxy's count.
rm -f "$PROFILES"/*.profraw

say "2/4 training"
WORK=$(mktemp -d)
cleanup() { kill "${LP:-}" "${MOCK_PID:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
GEN=$PGO_TARGET_DIR/gen/dist/loopwarden
# The instrumented proxy against the upstream at URL; its profile is written when it stops.
start_proxy() {
  # shellcheck disable=SC2046
  env $(upstream_env "$1") RUST_LOG=warn LLVM_PROFILE_FILE="$PROFILES/proxy-%p.profraw" \
    "$GEN" serve --listen 127.0.0.1:$LW_PORT --db "sqlite://$WORK/log.db" >"$WORK/proxy.log" 2>&1 &
  LP=$!
  wait_healthy $LW_PORT || { say "the instrumented proxy did not start: $(tail -3 "$WORK/proxy.log")"; exit 1; }
}
stop_proxy() {
  kill -TERM "$LP"
  wait "$LP" || { say "the instrumented proxy did not stop cleanly: $(tail -3 "$WORK/proxy.log")"; exit 1; }
  LP=
}
train() { # payload concurrency
  # shellcheck disable=SC2046
  "$DRIVER" --url "http://127.0.0.1:$LW_PORT$(payload_path "$1")" --body "$PAY/$1" -c "$2" \
    --duration "$TRAIN_SECONDS" --warmup 0.5 "${REQUEST_HEADERS[@]}" $(answer_checks "$1") \
    | python3 -c "import json,sys; d=json.load(sys.stdin); print(f'  $1 c$2: {d[\"requests\"]} requests, {d[\"errors\"]} errors')" >&2
}
train_api() { # api: the shapes and concurrencies scripts/bench.sh measures
  train "$1"_8k.json 1
  train "$1"_8k.json 16
  train "$1"_200k.json 16
  train "$1"_2m.json 4
  train "$1"_8k_stream.json 1
  train "$1"_200k_stream.json 8
  train "$1"_2m_stream.json 4
}
# The mock upstream is the instrumented binary itself; its profile is the mock's and is
# left out.
LLVM_PROFILE_FILE="$WORK/mock-%p.profraw" start_mock $MOCK_PORT "$GEN"
start_proxy "http://127.0.0.1:$MOCK_PORT"
train_api openai
train_api anthropic
train_api responses
train_api gemini
stop_proxy

say "3/4 merging the profile"
ls "$PROFILES"/proxy-*.profraw >/dev/null 2>&1 || { say "the proxy wrote no profile"; exit 1; }
"$PROFDATA" merge -o "$PROFILES/merged.profdata" "$PROFILES"/proxy-*.profraw
# Named by its content: cargo does not see a profile's content change, but it does see new
# RUSTFLAGS, and then rebuilds every crate (hyper's and tokio's code is most of a request's).
PROFILE=$PROFILES/loopwarden-$(sha256sum "$PROFILES/merged.profdata" | cut -c1-16).profdata
mv "$PROFILES/merged.profdata" "$PROFILE"

say "4/4 optimized build"
(cd "$ROOT" && CARGO_TARGET_DIR=$PGO_TARGET_DIR/use \
  RUSTFLAGS="-Cprofile-use=$PROFILE" cargo build --profile dist --locked --bin loopwarden >&2)
echo "$PGO_TARGET_DIR/use/dist/loopwarden"
