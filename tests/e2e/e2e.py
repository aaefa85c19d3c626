#!/usr/bin/env python3
"""End-to-end suite: real, unmodified agents against loopwarden, loopwarden against the
scripted mock model, all on loopback inside a private network namespace.

    client  ->  tap (records what the client sent and got)  ->  loopwarden serve  ->  loopwarden mock

Scenarios, per client:
  control  a productive run (read, failing test, real fix, passing test, final text): the
           client finishes normally and loopwarden changes nothing.
  loop     the model loops (same failing test, same read, an edit and its revert): loopwarden
           nudges, then halts, and the client stops by itself with the halt as its last word.
  teams    the loop twice through one loopwarden with two policies: under /t/ci (enforce)
           the client is halted; under /t/dev (shadow) it runs to the script's end untouched,
           and the log tells the two apart.
  ci       the loop under `loopwarden run --team ci` (the client's base URL only what `run`
           gives it; Codex's from `run`'s `-c` overrides): `run` exits 3, the halt is logged
           under the run's id and no request under another id.

Usage: tests/e2e/run.sh [--clients claude,codex,...] [--scenarios control,loop] [--direct]
Prints one line per check and ends with `N passed, N failed`.
"""

import argparse
import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients as C  # noqa: E402
from tap import Tap  # noqa: E402

CONTROL_DONE = "E2E-CONTROL-DONE: add() now adds and the tests pass."
UNHALTED = "E2E-UNHALTED: the looping script ran out and nobody halted it."
UNEXPECTED = "E2E-UNEXPECTED: the client asked for more turns than the script has."
SIDE_TEXT = "Fix the failing calc test"
# Gemini CLI's model router asks for a JSON verdict before each prompt.
SIDE_RULES = [{"match": "complexity_score",
               "text": '{"complexity_reasoning": "simple task", "complexity_score": 20}'}]
CLIENT_TIMEOUT = int(os.environ.get("LW_E2E_CLIENT_TIMEOUT", "180"))
# Requests a halted client may still send beyond the script (its own retries, side calls).
RETRY_ALLOWANCE = 4


# ------------------------------------------------------------------------------ scripts

def calls(*tool_calls):
    return {"tool_calls": list(tool_calls)}


def control_script(client, repo):
    turns = [
        {"text": "Let me look at the code first.", "tool_calls": [client.read(repo)]},
        calls(client.run_test(repo)),
        calls(client.edit(repo, C.BUGGY, C.FIXED)),
        calls(client.run_test(repo)),  # the same command, with a new result
        calls(client.edit(repo, C.MUL, C.MUL_AND_SUB)),
        calls(client.read(repo)),  # a second read, of a changed file
        calls(client.run_test(repo)),  # the same command and result, after a real edit
        client.final(CONTROL_DONE),
    ]
    return {"turns": turns, "end_text": UNEXPECTED, "side_text": SIDE_TEXT, "side_rules": SIDE_RULES}


def loop_script(client, repo):
    cycle = [
        calls(client.read(repo)),
        calls(client.run_test(repo)),
        calls(client.edit(repo, C.BUGGY, C.SAME_BUG)),
        calls(client.run_test(repo)),
        calls(client.edit(repo, C.SAME_BUG, C.BUGGY)),  # the revert
        calls(client.run_test(repo)),
    ]
    turns = [{"text": "Let me look at the code first.", "tool_calls": [client.read(repo)]}] + cycle * 4
    return {"turns": turns, "end_text": UNHALTED, "side_text": SIDE_TEXT, "side_rules": SIDE_RULES}


# What the mock answers Claude Code's summary request (it asks for an <analysis> and a
# <summary>).
SUMMARY = ("<analysis>The user asked to fix calc.py.</analysis>\n<summary>1. Primary Request and Intent: "
           "fix the failing test in calc.py.\n2. Progress: read calc.py several times; no edit yet.\n"
           "3. Next step: edit add() to return a + b.</summary>")


def compact_script(client, repo):
    """The model reads calc.py again and again while its answers report a context nearly
    full: Claude Code auto-compacts mid-run (its summary request, then a history that starts
    from the summary) and the reads go on after it."""
    reads = [calls(client.read(repo)) for _ in range(10)]
    reads[0]["text"] = "Let me look at the code first."
    for turn, tokens in ((1, 600000), (2, 940000), (3, 985000)):
        reads[turn]["usage"] = {"input": tokens}
    rules = SIDE_RULES + [{"match": "CRITICAL: Respond with TEXT ONLY", "text": SUMMARY}]
    return {"turns": reads, "end_text": UNHALTED, "side_text": SIDE_TEXT, "side_rules": rules}


SCENARIOS = {"control": control_script, "loop": loop_script, "teams": loop_script, "compact": compact_script,
             "ci": loop_script}

# The policies of the `teams` scenario: one team enforced, one in shadow.
TEAMS_CONFIG = '''
[[policy]]
name = "ci"
match = { team = "ci" }

[[policy]]
name = "dev"
mode = "shadow"
match = { team = "dev" }
'''


# ------------------------------------------------------------------------------ reporting

class Report:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, label, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'PASS' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}", flush=True)

    def skip(self, label, why):
        self.skipped += 1
        print(f"SKIP {label}: {why}", flush=True)


def short(text, n=100):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "…"


# ------------------------------------------------------------------------------ processes

class Proc:
    """A background process of ours, in its own process group, stopped by its pid."""

    def __init__(self, argv, log, env=None, stdout=None):
        self.log = open(log, "wb")
        self.p = subprocess.Popen(argv, env=env, stdout=stdout or self.log, stderr=self.log,
                                  stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.p.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def start_mock(binary, script_path, capture, log):
    proc = Proc([binary, "mock", "--listen", "127.0.0.1:0", "--script", str(script_path),
                 "--capture", str(capture)], log, stdout=subprocess.PIPE)
    line = proc.p.stdout.readline().decode()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.stop()
        raise RuntimeError(f"mock did not start: {line!r}, see {log}")
    return proc, int(m.group(1))


def start_serve(binary, mock_port, db, log, config=None):
    port = free_port()
    upstream = f"http://127.0.0.1:{mock_port}"
    env = dict(os.environ, LOOPWARDEN_OPENAI_BASE_URL=upstream, LOOPWARDEN_ANTHROPIC_BASE_URL=upstream,
               LOOPWARDEN_GEMINI_BASE_URL=upstream, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    argv = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--db", f"sqlite://{db}"]
    if config:
        argv += ["--config", str(config)]
    proc = Proc(argv, log, env=env)
    if not wait_for_port(port, proc):
        proc.stop()
        raise RuntimeError(f"loopwarden serve did not start, see {log}")
    return proc, port


def client_env(home, repo, extra):
    """The caller's environment minus anything that could point a client elsewhere."""
    drop = ("OPENAI", "ANTHROPIC", "GEMINI", "GOOGLE", "CLAUDE", "CODEX", "OPENCODE", "LITELLM",
            "MSWEA", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "LOOPWARDEN")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    # opencode takes its working directory from $PWD, not from the process's cwd.
    env.update(HOME=str(home), PWD=str(repo), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(extra)
    return env


def run_client(client, repo, run_dir, base_url, wrap=()):
    """Runs the client (its argv after `wrap`, e.g. `loopwarden run ... --`): its exit
    status and standard output."""
    home = run_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    argv, extra = client.command(repo, home, base_url, run_dir)
    argv = list(wrap) + argv
    out, err = run_dir / "client.out", run_dir / "client.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        p = subprocess.Popen(argv, cwd=repo, env=client_env(home, repo, extra), stdout=o, stderr=e,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(CLIENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = "timeout"
    # Whatever the client left running (shells, servers) goes with it.
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return rc, out.read_text(errors="replace")


# ------------------------------------------------------------------------------ evidence

def read_capture(path):
    recs = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        raw = rec.get("body_raw")
        rec["sha256"] = hashlib.sha256(raw.encode()).hexdigest() if raw is not None else None
        recs.append(rec)
    return recs


CONVERSATION_APIS = {"openai_chat", "openai_responses", "anthropic", "gemini"}


def strings_in(value, out):
    """Every string in a JSON value, long ones split into lines (appended text shows up as
    lines of its own even when joined to an existing string)."""
    if isinstance(value, str):
        out.add(value)
        out.update(line.strip() for line in value.splitlines() if line.strip())
    elif isinstance(value, list):
        for v in value:
            strings_in(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            strings_in(v, out)
    return out


def added_text(mock_rec, client_bodies):
    """Text in a request the mock received that no client request carried."""
    sent = set()
    for body in client_bodies:
        try:
            strings_in(json.loads(body), sent)
        except (ValueError, UnicodeDecodeError):
            pass
    got = strings_in(mock_rec.get("body"), set())
    return sorted((s for s in got - sent if len(s) > 20), key=len, reverse=True)


def query(db, sql):
    """Rows of a read-only query on loopwarden's log (schema: migrations/), or an error text."""
    if not Path(db).exists():
        return f"no database at {db}"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"{e}"


# ------------------------------------------------------------------------------ one run

def run_one(client, scenario, args, report):
    if scenario == "teams":
        return run_teams(client, args, report)
    if scenario == "ci":
        return run_ci(client, args, report)
    label = f"{client.name}/{scenario}"
    if scenario == "compact" and client.name != "claude":
        report.skip(label, "the mock's nearly full context makes only Claude Code compact")
        return
    run_dir = Path(args.out) / client.name / scenario
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    repo = Path(args.out) / "repos" / f"{client.name}-{scenario}"
    C.make_repo(repo)
    script = SCENARIOS[scenario](client, repo)
    script_path = run_dir / "script.json"
    script_path.write_text(json.dumps(script, indent=1))
    capture, db = run_dir / "mock.jsonl", run_dir / "loopwarden.db"

    procs = []
    started = time.time()
    try:
        mock, mock_port = start_mock(args.binary, script_path, capture, run_dir / "mock.log")
        procs.append(mock)
        target = mock_port
        if not args.direct:
            serve, target = start_serve(args.binary, mock_port, db, run_dir / "serve.log")
            procs.append(serve)
        with Tap(target) as tap:
            rc, stdout = run_client(client, repo, run_dir, tap.url)
            exchanges = list(tap.exchanges)
    except RuntimeError as e:
        report.check(f"{label} setup", False, str(e))
        return
    finally:
        for p in reversed(procs):
            p.stop()
    wall = time.time() - started
    mock_recs = read_capture(capture)
    (run_dir / "tap.jsonl").write_text("".join(json.dumps({
        "method": ex.method, "path": ex.path, "sha256": ex.sha256, "status": ex.status,
        "decision": ex.decision, "error": ex.error, "websocket": ex.websocket,
        "frames": len(ex.frames)}) + "\n" for ex in exchanges))
    last = client.last_message(stdout, run_dir)
    print(f"---- {label}: exit {rc}, {len(exchanges)} client requests, {len(mock_recs)} reached the mock, "
          f"{wall:.1f}s, last message: {short(last)!r}  ({run_dir})", flush=True)

    turn_recs = [r for r in mock_recs if r.get("answer") in ("turn", "error")]
    scripted_texts = {t.get("text") for t in script["turns"]} | {UNEXPECTED, UNHALTED}
    report.check(f"{label} client exit status 0", rc == 0, f"got {rc}")
    ctx = dict(label=label, repo=repo, client=client, script=script, stdout=stdout, run_dir=run_dir, last=last,
               exchanges=exchanges, mock_recs=mock_recs, turn_recs=turn_recs, db=db,
               scripted_texts=scripted_texts, report=report, direct=args.direct)
    if scenario == "control":
        check_control(**ctx)
    elif scenario == "compact":
        check_compact(**ctx)
    else:
        check_loop(**ctx)
    if client.websocket:
        check_websocket(**ctx)


def check_control(label, repo, client, script, stdout, run_dir, last, exchanges, mock_recs, turn_recs, db,
                  scripted_texts, report, direct):
    n_turns = len(script["turns"])
    report.check(f"{label} client stopped normally", client.stopped_cleanly(stdout, run_dir))
    report.check(f"{label} last message is the script's final text", CONTROL_DONE in last, repr(short(last)))
    report.check(f"{label} mock answered each scripted turn once",
                 [r["turn"] for r in turn_recs] == list(range(n_turns)),
                 f"turns seen {[r['turn'] for r in turn_recs]}")
    # A WebSocket's opening and its prewarm frame ask the model nothing.
    asked = [r for r in mock_recs if r.get("answer") not in ("upgrade", "prewarm")]
    report.check(f"{label} no extra requests", len(asked) <= n_turns + client.side_requests,
                 f"{len(asked)} requests for {n_turns} turns + {client.side_requests} side")
    # The tools really ran: the history shows the test failing, then passing after the edit.
    bodies = {r["turn"]: r.get("body_raw") or "" for r in turn_recs}
    report.check(f"{label} tools ran: test failed, then passed after the real edit",
                 "FAILED: test_calc.py" in bodies.get(2, "") and "all tests passed" in bodies.get(4, "")
                 and (repo / "calc.py").read_text() == C.CALC_PY.replace(C.BUGGY, C.FIXED).replace(C.MUL, C.MUL_AND_SUB))
    sent = sorted(sent_hashes(exchanges))
    got = sorted(received_hash(r) for r in mock_recs if r.get("answer") != "upgrade")
    report.check(f"{label} mock received byte-identical bodies", sent == got,
                 f"{sum(1 for h in got if h not in sent)} of {len(got)} differ")
    decisions = sorted({ex.decision for ex in exchanges if ex.decision not in (None, "observe")})
    report.check(f"{label} no decision other than observe", not decisions, f"saw {decisions}")
    if direct:
        report.skip(f"{label} log", "--direct: no loopwarden in the path")
        return
    report.check(f"{label} every response carries x-loopwarden-decision: observe",
                 all(ex.decision == "observe" for ex in exchanges if ex.status == 200),
                 f"decisions {sorted({str(ex.decision) for ex in exchanges})}")
    # A socket's turn is logged with the size of the request it stands for (its history
    # rebuilt), not of its frame.
    log_requests = query(db, "select request_bytes, applied from requests where method != 'WS' order by id")
    ok = isinstance(log_requests, list)
    report.check(f"{label} log holds every request, forwarded unmodified, same sizes",
                 ok and sorted(n for n, _ in log_requests) == sorted(len(ex.body) for ex in exchanges)
                 and all(a == "forwarded" for _, a in log_requests)
                 and all(a == "forwarded" for a, in query(db, "select applied from requests where method = 'WS'")),
                 f"{len(log_requests)} rows, applied {sorted({a for _, a in log_requests})}" if ok else log_requests)
    convs = query(db, "select id, client, dialect from conversations")
    report.check(f"{label} log holds the conversation", isinstance(convs, list) and len(convs) >= 1, f"{convs}")
    names = {c["name"] for t in script["turns"] for c in t.get("tool_calls", [])}
    n_calls = sum(len(t.get("tool_calls", [])) for t in script["turns"])
    calls_logged = query(db, "select name, result_hash is not null from tool_calls")
    ok = isinstance(calls_logged, list)
    with_result = sum(1 for name, has in calls_logged if name in names and has) if ok else 0
    # Every scripted call but the last turn's has its result in a later request.
    expected = n_calls - len(script["turns"][-1].get("tool_calls", []))
    report.check(f"{label} log holds the tool calls with their results", ok and with_result >= expected,
                 f"{with_result} of {expected} calls with a result" if ok else calls_logged)
    decisions = query(db, "select action, reason from decisions")
    report.check(f"{label} log holds no intervention", decisions == [], f"{decisions}")


def check_loop(label, repo, client, script, stdout, run_dir, last, exchanges, mock_recs, turn_recs, db,
               scripted_texts, report, direct):
    n_turns = len(script["turns"])
    report.check(f"{label} client stopped by itself", client.stopped_cleanly(stdout, run_dir))
    # The loop is real: the test ran for real and kept failing the same way.
    last_seen = turn_recs[-1].get("body_raw") or "" if turn_recs else ""
    failures = last_seen.count("FAILED: test_calc.py::test_add - AssertionError: add(2, 2) returned 0")
    report.check(f"{label} the model looped on a real, identical failure", failures >= 2,
                 f"{failures} identical failures in the last history the mock saw")
    # The nudge: text in an upstream request that the client never sent, after the loop began.
    client_bodies = [ex.body for ex in exchanges] + [f for ex in exchanges for f in ex.frames]
    nudged = [(r["turn"], added_text(r, client_bodies)) for r in turn_recs
              if r["sha256"] not in {ex.sha256 for ex in exchanges}]
    # The default reminder and halt texts speak as "[loopwarden]".
    nudged = [(turn, added) for turn, added in nudged if any("loopwarden" in a.lower() for a in added)]
    report.check(f"{label} mock received a nudge after the loop began",
                 any(turn >= 2 for turn, _ in nudged),
                 f"first at turn {nudged[0][0]}: {short(nudged[0][1][0], 120)!r}" if nudged else "none")
    # A delivered halt is a reply loopwarden wrote: the mock never says "[loopwarden]". (The
    # decision header alone is not enough: it names the decision even when it was not applied,
    # and a block replaces a streamed tool call after the headers went out.)
    halts = [i for i, ex in enumerate(exchanges) if b"[loopwarden]" in ex.response]
    report.check(f"{label} client received a halt", bool(halts),
                 f"at request {halts[0] + 1} of {len(exchanges)}, decision header {exchanges[halts[0]].decision!r}"
                 if halts else f"none; decision headers seen {sorted({str(ex.decision) for ex in exchanges})}")
    report.check(f"{label} last message is the halt text",
                 "loopwarden" in last.lower() and last not in scripted_texts, repr(short(last)))
    if halts:
        after = len(exchanges) - 1 - halts[0]
        report.check(f"{label} client stopped at the halt", after <= RETRY_ALLOWANCE,
                     f"{after} requests after the first halt")
    bound = n_turns + client.side_requests + RETRY_ALLOWANCE
    report.check(f"{label} requests bounded", len(exchanges) <= bound,
                 f"{len(exchanges)} client requests (bound {bound})")
    if direct:
        report.skip(f"{label} log", "--direct: no loopwarden in the path")
        return
    findings = query(db, "select detector, summary from findings")
    report.check(f"{label} log holds findings", isinstance(findings, list) and len(findings) > 0,
                 f"{len(findings)} findings, e.g. {short(findings[0], 120)!r}"
                 if isinstance(findings, list) and findings else f"{findings}")
    rows = query(db, "select action, applied from decisions order by created_ms, request_id")
    ok = isinstance(rows, list)
    applied = [f"{action}:{how}" for action, how in rows] if ok else []
    # Applied, not only decided: `applied` says what the proxy did, and plain "forwarded"
    # means it let the request through unchanged.
    # The first intervention is a nudge or replan (rollback for some patterns, opt-in).
    nudged = any(a in ("nudge", "replan", "rollback") and how != "forwarded" for a, how in rows) if ok else False
    # A block (the looping call replaced by the halt in the answer) stops the run as a halt does.
    halted = any(a in ("halt", "block") and how != "forwarded" for a, how in rows) if ok else False
    report.check(f"{label} log holds the applied nudge (or replan/rollback) and halt", nudged and halted,
                 f"decisions {short(applied, 160)}" if ok else rows)


def sent_hashes(exchanges):
    """What the client sent, hashed: each request body, and each `response.create` frame of
    a WebSocket (its other frames are not requests)."""
    out = []
    for ex in exchanges:
        if not ex.websocket:
            out.append(ex.sha256)
            continue
        for frame in ex.frames:
            try:
                if json.loads(frame).get("type") == "response.create":
                    out.append(hashlib.sha256(frame).hexdigest())
            except (ValueError, AttributeError):
                pass
    return out


def received_hash(rec):
    """What the mock received, hashed: a WebSocket frame as it came, else the body."""
    if rec.get("frame") is not None:
        return hashlib.sha256(rec["frame"].encode()).hexdigest()
    return rec["sha256"] or ""


def check_websocket(label, exchanges, mock_recs, turn_recs, db, report, **_):
    """The client's turns went over its WebSocket through loopwarden, not HTTP."""
    sockets = [ex for ex in exchanges if ex.websocket]
    report.check(f"{label} client opened the WebSocket through loopwarden (101)",
                 any(ex.status == 101 for ex in sockets),
                 f"upgrades answered {[ex.status for ex in sockets]}")
    posts = [ex for ex in exchanges if ex.method == "POST" and ex.path.endswith("/responses")]
    report.check(f"{label} no fallback to HTTP", not posts, f"{len(posts)} POST /responses")
    creates = sum(1 for ex in sockets for f in ex.frames if b'"response.create"' in f)
    report.check(f"{label} every turn the mock answered came as a frame",
                 bool(turn_recs) and all(r.get("method") == "WS" for r in turn_recs),
                 f"{creates} response.create frames sent, methods {sorted({r.get('method') for r in turn_recs})}")
    rows = query(db, "select count(*) from requests where method = 'WS'")
    n = rows[0][0] if isinstance(rows, list) else 0
    report.check(f"{label} log holds each socket turn as a request", n >= len(turn_recs),
                 f"{n} WS rows for {len(turn_recs)} turns")


def check_compact(label, repo, client, script, stdout, run_dir, last, exchanges, mock_recs, turn_recs, db,
                  scripted_texts, report, direct):
    """One run across an auto-compaction: its summary request reached the mock as the client
    sent it, the run was nudged before it and escalated after it (not observed afresh), and
    the log holds one run with the compaction marked."""
    summaries = [ex for ex in exchanges if b"CRITICAL: Respond with TEXT ONLY" in ex.body]
    report.check(f"{label} the client compacted", bool(summaries), f"{len(exchanges)} requests")
    if not summaries:
        return
    received = {r["sha256"] for r in mock_recs}
    report.check(f"{label} its summary request reached the mock byte for byte",
                 all(ex.sha256 in received for ex in summaries),
                 f"{sum(1 for ex in summaries if ex.sha256 not in received)} of {len(summaries)} differ")
    first = exchanges.index(summaries[0])
    continued = [ex for ex in exchanges[first + 1:] if b"This session is being continued" in ex.body]
    report.check(f"{label} the run went on from the summary", bool(continued), f"{len(continued)} requests")
    if direct:
        report.skip(f"{label} log", "--direct: no loopwarden in the path")
        return
    before = [ex.decision for ex in exchanges[:first]]
    after = [ex.decision for ex in exchanges[first + 1:]]
    report.check(f"{label} nudged before the compaction", "nudge" in before, f"{before}")
    report.check(f"{label} escalated after it, not observed afresh",
                 any(d in ("replan", "halt", "block") for d in after), f"{after}")
    halts = [ex for ex in exchanges if b"[loopwarden]" in ex.response]
    report.check(f"{label} client received a halt", bool(halts) and "loopwarden" in last.lower(),
                 repr(short(last)))
    marked = query(db, "select count(*) from requests where compaction = 'claude_summary'")
    report.check(f"{label} log marks the summary request", marked not in ([(0,)],) and isinstance(marked, list),
                 f"{marked}")
    runs = query(db, "select count(distinct conversation_id) from requests where dialect is not null")
    report.check(f"{label} log holds one run", runs == [(1,)], f"{runs}")


def run_teams(client, args, report):
    """The looping script twice through one loopwarden: the `ci` team's run under an
    enforcing policy, the `dev` team's under a shadow one."""
    label = f"{client.name}/teams"
    run_dir = Path(args.out) / client.name / "teams"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    if args.direct:
        report.skip(label, "--direct: no loopwarden in the path")
        return
    # One repository, made afresh for each team's run, and one script for both: the mock
    # answers by the turns in each request's history.
    repo = Path(args.out) / "repos" / f"{client.name}-teams"
    script = loop_script(client, repo)
    script_path = run_dir / "script.json"
    script_path.write_text(json.dumps(script, indent=1))
    config = run_dir / "loopwarden.toml"
    config.write_text(TEAMS_CONFIG)
    capture, db = run_dir / "mock.jsonl", run_dir / "loopwarden.db"
    runs = {}
    procs = []
    try:
        mock, mock_port = start_mock(args.binary, script_path, capture, run_dir / "mock.log")
        procs.append(mock)
        serve, port = start_serve(args.binary, mock_port, db, run_dir / "serve.log", config)
        procs.append(serve)
        for team in ("ci", "dev"):
            C.make_repo(repo)
            team_dir = run_dir / team
            team_dir.mkdir()
            with Tap(port) as tap:
                rc, stdout = run_client(client, repo, team_dir, f"{tap.url}/t/{team}")
                runs[team] = (rc, stdout, list(tap.exchanges), client.last_message(stdout, team_dir))
    except RuntimeError as e:
        report.check(f"{label} setup", False, str(e))
        return
    finally:
        for p in reversed(procs):
            p.stop()
    mock_recs = read_capture(capture)
    for team, (rc, _, exchanges, last) in runs.items():
        print(f"---- {label}/{team}: exit {rc}, {len(exchanges)} client requests, "
              f"last message: {short(last)!r}  ({run_dir / team})", flush=True)
        report.check(f"{label}/{team} client exit status 0", rc == 0, f"got {rc}")
    _, _, ci, ci_last = runs["ci"]
    _, _, dev, dev_last = runs["dev"]
    halts = [i for i, ex in enumerate(ci) if b"[loopwarden]" in ex.response]
    report.check(f"{label}/ci halted", bool(halts) and "loopwarden" in ci_last.lower(), repr(short(ci_last)))
    report.check(f"{label}/dev got no word of loopwarden",
                 not any(b"[loopwarden]" in ex.response for ex in dev), f"{len(dev)} answers")
    dev_bodies = set(sent_hashes(dev))
    dev_turns = [r["turn"] for r in mock_recs if received_hash(r) in dev_bodies and r.get("answer") == "turn"]
    n_turns = len(script["turns"])
    # Its client read every scripted turn (mini-swe-agent then asks again: it ends on a
    # command of its own, which the script never sends).
    report.check(f"{label}/dev ran to the end of the script", max(dev_turns, default=-1) >= n_turns - 1,
                 f"last turn {max(dev_turns, default=None)} of {n_turns}; last message {short(dev_last)!r}")
    received = {received_hash(r) for r in mock_recs}
    dev_sent = sent_hashes(dev)
    report.check(f"{label}/dev every request reached the mock byte for byte",
                 all(h in received for h in dev_sent),
                 f"{sum(1 for h in dev_sent if h not in received)} of {len(dev_sent)} differ")
    # A shadow policy's answer says `observe` (what was done), never what it would have done.
    report.check(f"{label}/dev answers say observe, never what shadow would have done",
                 all(ex.decision in (None, "observe") for ex in dev),
                 f"{sorted({str(ex.decision) for ex in dev})}")
    rows = query(db, "select policy, applied from interventions where policy is not null")
    ok = isinstance(rows, list)
    by_policy = {}
    for policy, applied in rows if ok else []:
        by_policy.setdefault(policy, set()).add(applied)
    report.check(f"{label} log: ci's interventions applied, dev's only would-be",
                 ok and "halted" in by_policy.get("ci", set())
                 and by_policy.get("dev") and all(a.startswith("would_") for a in by_policy["dev"])
                 and "would_halt" in by_policy["dev"],
                 f"{ {k: sorted(v) for k, v in by_policy.items()} }" if ok else rows)
    policies = query(db, "select distinct policy from requests order by policy")
    report.check(f"{label} log: every request names its team's policy",
                 policies == [("ci",), ("dev",)], f"{policies}")


def run_ci(client, args, report):
    """The looping script under `loopwarden run --team ci`: the client's base URL is only
    what `run` gives it (its variables; Codex's `-c` overrides, its own provider's base URL
    being the bare proxy), and `run`'s exit status says the run was halted."""
    label = f"{client.name}/ci"
    run_dir = Path(args.out) / client.name / "ci"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    if args.direct:
        report.skip(label, "--direct: no loopwarden in the path")
        return
    if not client.base_url_from_env:
        report.skip(label, "its base URL is in its own config, which `loopwarden run` does not set")
        return
    repo = Path(args.out) / "repos" / f"{client.name}-ci"
    C.make_repo(repo)
    script = loop_script(client, repo)
    script_path = run_dir / "script.json"
    script_path.write_text(json.dumps(script, indent=1))
    config = run_dir / "loopwarden.toml"
    config.write_text(TEAMS_CONFIG)
    capture, db = run_dir / "mock.jsonl", run_dir / "loopwarden.db"
    run_id = f"e2e-ci-{client.name}"
    procs = []
    try:
        mock, mock_port = start_mock(args.binary, script_path, capture, run_dir / "mock.log")
        procs.append(mock)
        serve, port = start_serve(args.binary, mock_port, db, run_dir / "serve.log", config)
        procs.append(serve)
        with Tap(port) as tap:
            wrap = [args.binary, "run", "--proxy", tap.url, "--team", "ci", "--id", run_id, "--"]
            # The client's own base URL setting is the bare proxy: `run` must do the rest.
            rc, stdout = run_client(client, repo, run_dir, tap.url, wrap)
            exchanges = list(tap.exchanges)
    except RuntimeError as e:
        report.check(f"{label} setup", False, str(e))
        return
    finally:
        for p in reversed(procs):
            p.stop()
    last = client.last_message(stdout, run_dir)
    print(f"---- {label}: exit {rc}, {len(exchanges)} client requests, last message: {short(last)!r}  "
          f"({run_dir})", flush=True)
    report.check(f"{label} loopwarden run exit status 3 (halted)", rc == 3,
                 f"got {rc}; {short((run_dir / 'client.err').read_text(errors='replace')[-300:], 300)}")
    report.check(f"{label} the client got the halt", "loopwarden" in last.lower(), repr(short(last)))
    halts = query(db, f"select count(*) from interventions where conversation_id = '{run_id}' "
                      "and applied = 'halted'")
    report.check(f"{label} log: the halt is under the run's id", halts == [(1,)] or (
        isinstance(halts, list) and halts and halts[0][0] >= 1), f"{halts}")
    others = query(db, "select distinct conversation_id, policy from requests where dialect is not null")
    report.check(f"{label} log: every model request is the run's, under team ci's policy",
                 others == [(run_id, "ci")], f"{others}")


# ------------------------------------------------------------------------------ main

def enter_netns():
    """Re-runs this script in a network namespace with only loopback, so no client can
    reach any other host whatever it tries."""
    if os.environ.get("LW_E2E_IN_NETNS") == "1":
        return
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        print("WARNING: cannot create a network namespace; clients are kept local by env only", flush=True)
        return
    os.environ["LW_E2E_IN_NETNS"] = "1"
    os.execvp("unshare", ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                          sys.executable, os.path.abspath(__file__)] + sys.argv[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default=",".join(c.name for c in C.ALL))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--direct", action="store_true", help="clients talk to the mock without loopwarden")
    ap.add_argument("--binary", default=os.environ.get("LOOPWARDEN_BIN", "loopwarden"))
    ap.add_argument("--out", default=os.environ.get("LW_E2E_OUT", "/tmp/lw-e2e"))
    ap.add_argument("--no-netns", action="store_true")
    args = ap.parse_args()
    chosen = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in C.BY_NAME] + \
              [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown client or scenario: {', '.join(unknown)}")
    report = Report()

    # Installing needs the registries, so it happens before entering the namespace.
    if os.environ.get("LW_E2E_IN_NETNS") != "1":
        for name in chosen:
            client = C.BY_NAME[name]
            if not client.installed():
                print(f"installing {name} into {C.CACHE} ...", flush=True)
                try:
                    client.install()
                except (subprocess.CalledProcessError, OSError) as e:
                    print(f"install of {name} failed: {e}", flush=True)
        if not args.no_netns:
            enter_netns()

    started = time.time()
    for name in chosen:
        client = C.BY_NAME[name]
        if not client.installed():
            report.check(f"{name} installed", False, f"not found under {C.CACHE}")
            continue
        for scenario in args.scenarios.split(","):
            run_one(client, scenario, args, report)
    print(f"---- total {time.time() - started:.0f}s, output in {args.out}"
          + (f", {report.skipped} skipped" if report.skipped else ""))
    print(f"{report.passed} passed, {report.failed} failed")
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
