#!/usr/bin/env python3
"""What loopwarden keeps per conversation once the conversation goes idle (issue 5: under
1 KB beyond what the log holds).

    scripts/idle_memory.py LOOPWARDEN_BIN [N [WAVES]]

Starts a mock upstream (the binary's own, `loopwarden mock`) and loopwarden (cache.idle_secs = 2, a fresh SQLite log), runs N
distinct conversations of 4 requests each (~20 KB histories, OpenAI shape, no id headers),
lets them go idle until the sweeper has dropped their state, and prints the proxy's RSS
before, at the peak and after, and what the admin API says it still holds. RSS after idle
includes what the allocator keeps for reuse; the admin figures are the proxy's own state.
Then WAVES - 1 more waves of N new conversations (default 2), each let go idle, with the
RSS each one added: state kept per conversation would add the same every wave, while
caches that fill up to a bound (SQLite's page caches, as the log grows) add less and less
and then nothing.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 500
WAVES = int(sys.argv[3]) if len(sys.argv) > 3 else 3
MOCK_PORT, PORT = 18280, 18290


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_port(port):
    for _ in range(100):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz" if port == PORT else "/health")
            c.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"port {port} did not come up")


def body(task, turns):
    msgs = [{"role": "system", "content": "You are a careful coding agent. " * 20},
            {"role": "user", "content": task}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": f"Reading part {i}.", "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{i}.rs"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}",
                     "content": "\n".join(f"{n:5}\tlet x{n} = {task[:12]}({n});" for n in range(120))})
    return json.dumps({"model": "gpt-4.1", "messages": msgs,
                       "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]})


def stats(conn):
    conn.request("GET", "/admin/api/stats")
    return json.loads(conn.getresponse().read())


work = tempfile.mkdtemp(prefix="lw-idle-")
cfg = os.path.join(work, "loopwarden.toml")
with open(cfg, "w") as f:
    f.write("[cache]\nidle_secs = 2\n")
procs = []
try:
    procs.append(subprocess.Popen([BIN, "mock", "--listen", f"127.0.0.1:{MOCK_PORT}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    lw = subprocess.Popen([BIN, "serve", "--config", cfg, "--listen", f"127.0.0.1:{PORT}",
                           "--db", f"sqlite://{work}/log.db"],
                          env={**os.environ, "RUST_LOG": "warn",
                               "LOOPWARDEN_OPENAI_BASE_URL": f"http://127.0.0.1:{MOCK_PORT}"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(lw)
    wait_port(MOCK_PORT)
    wait_port(PORT)
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    hdr = {"content-type": "application/json", "authorization": "Bearer sk-idle-test"}

    def send(b):
        conn.request("POST", "/v1/chat/completions", b, hdr)
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status

    send(body("warm-up task", 1))
    time.sleep(3)
    before = rss_kb(lw.pid)
    peak = before
    def run(wave):
        nonlocal_peak = 0
        for c in range(N):
            task = f"wave {wave} task {c:05d}: fix the parser"
            for turns in range(4):
                send(body(task, turns * 2))
            nonlocal_peak = max(nonlocal_peak, rss_kb(lw.pid))
        return nonlocal_peak

    def idle():
        for _ in range(100):
            time.sleep(0.5)
            s = stats(conn)
            if s["live_conversations"] == 0 and s["cache"]["bytes"] == 0:
                return s
        return s

    peak = max(peak, run(1))
    held = stats(conn)
    s = idle()
    after = rss_kb(lw.pid)
    print(f"{N} conversations x 4 requests (~{len(body('x', 6)) // 1024} KB last body each)")
    print(f"  RSS before {before / 1024:.1f} MB, peak {peak / 1024:.1f} MB, after idle {after / 1024:.1f} MB")
    print(f"  RSS kept after idle per conversation: {max(0, after - before) * 1024 / N:.0f} bytes"
          " (allocator free lists included)")
    print(f"  held by the proxy while live: {held['live_conversations']} conversation entries, "
          f"cache {held['cache']['messages']} messages / {held['cache']['bytes']} bytes")
    print(f"  held by the proxy after idle: {s['live_conversations']} conversation entries, "
          f"cache {s['cache']['messages']} messages / {s['cache']['bytes']} bytes", flush=True)
    # More waves of as many new conversations: if each wave's memory stayed held, RSS would
    # grow by as much every wave; it is reused instead (what grows is bounded caches).
    last = after
    for wave in range(2, WAVES + 1):
        peak_w = run(wave)
        s = idle()
        after_w = rss_kb(lw.pid)
        print(f"  wave {wave} of {N} new conversations: peak {peak_w / 1024:.1f} MB, after idle "
              f"{after_w / 1024:.1f} MB (growth over the wave before: "
              f"{max(0, after_w - last) * 1024 / N:.0f} bytes per conversation; held by the proxy: "
              f"{s['live_conversations']} conversation entries, {s['cache']['messages']} cached messages)",
              flush=True)
        last = after_w
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    # The proxy's log and config (tens of MB after a few waves).
    shutil.rmtree(work, ignore_errors=True)
