#!/usr/bin/env python3
"""Memory under large conversations (issue 38: per-conversation state bounded by bytes).

    scripts/large_conversations.py LOOPWARDEN_BIN [N [MB [WAVES]]]

Starts `loopwarden mock` and loopwarden (default config, a fresh SQLite log), then WAVES
waves (default 2) of N conversations (default 16) at once, each of two requests whose
history is about MB megabytes (default 20; OpenAI shape, each conversation its own id).
After each wave it prints the proxy's resident memory (now and its peak) and what
`/admin/api/stats` says is held. Without a bound, every wave adds its conversations'
bodies and transcripts; with one, resident memory levels off.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16
MB = int(sys.argv[3]) if len(sys.argv) > 3 else 20
WAVES = int(sys.argv[4]) if len(sys.argv) > 4 else 2
MOCK_PORT, PORT = 18380, 18390


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def wait_port(port):
    for _ in range(200):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def body(conversation, turns):
    # Each turn a tool call and an output of ~1 MB, so `MB` turns make ~MB megabytes.
    chunk = f"{conversation} " + "x" * (1 << 20)
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"task {conversation}"}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps({"command": f"cat part{i}"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": chunk})
    return json.dumps({"model": "gpt-test", "messages": messages}).encode()


def post(conversation, payload):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", f"/c/{conversation}/v1/chat/completions", payload,
              {"content-type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status


def conversation(name):
    post(name, body(name, MB - 1))
    post(name, body(name, MB))


def main():
    work = tempfile.mkdtemp()
    mock = subprocess.Popen([BIN, "mock", "--listen", f"127.0.0.1:{MOCK_PORT}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, LOOPWARDEN_OPENAI_BASE_URL=f"http://127.0.0.1:{MOCK_PORT}")
    proxy = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{PORT}",
                              "--db", f"sqlite://{work}/log.db"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(MOCK_PORT)
        wait_port(PORT)
        for wave in range(WAVES):
            threads = [threading.Thread(target=conversation, args=(f"w{wave}c{i}",))
                       for i in range(N)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
            c.request("GET", "/admin/api/stats")
            stats = json.loads(c.getresponse().read())
            print(json.dumps({
                "wave": wave + 1, "conversations_sent": N * (wave + 1), "mb_each": MB,
                "rss_mb": round(status_kb(proxy.pid, "VmRSS") / 1024, 1),
                "peak_rss_mb": round(status_kb(proxy.pid, "VmHWM") / 1024, 1),
                "live_conversations": stats.get("live_conversations"),
                "conversation_mb": round(stats.get("conversation_bytes", 0) / 2**20, 1),
                "cached_message_mb": round(stats["cache"]["bytes"] / 2**20, 1),
            }), flush=True)
    finally:
        proxy.terminate()
        mock.terminate()
        proxy.wait()
        mock.wait()
        shutil.rmtree(work, ignore_errors=True)


main()
