#!/usr/bin/env python3
"""Where the kernel ran each request of a c1 bench run, from a scheduler trace.

    scripts/sched_placement.sh          # traces a bench run of the 8.8 KB c1 loads, runs this
    python3 scripts/sched_placement.py TRACE

TRACE is tracefs's text trace of `sched_waking` and `sched_switch`. A proxy's request at
concurrency 1 wakes the mock (the request forwarded) and then the driver (the answer
relayed). Each of those wake-ups either lands on the proxy's own CPU (the wakee runs as
soon as the proxy sleeps) or on the other CPU (which, idle by then, must wake up first).
Each request is classed by where the proxy woke the two:

    A  the mock on the proxy's CPU, the driver on the other: one crossing each way
    B  the driver on the proxy's CPU, the mock on the other
    C  both on the other CPU: the proxy alone, every hop crosses
    D  both on the proxy's CPU

Per window (a proxy's run of one load: requests with gaps under 0.3 s, less the driver's
warm-up, WARMUP=0.5 s) it prints the share of each class, the request cycle (one driver
wake-up to the next) at the median for each class and in all, and the proxy's own turns
at the median: `out` from the proxy running after the driver woke it to its waking the
mock, `back` from running after the mock woke it to its waking the driver. The load of a
window is not in the trace; windows are listed in the order the harness ran them.
"""
import os
import re
import sys
from collections import defaultdict, namedtuple
from statistics import median

LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (sched_\w+): (.*)$")
FIELD = re.compile(r"(\w+)=(\S+)")
DRIVER, MOCK = "benchdrv", "mockup"
CLASSES = "ABCD"
# (the mock woken on the proxy's CPU, the driver woken on the proxy's CPU) -> class
CLASS = {(True, False): "A", (False, True): "B", (False, False): "C", (True, True): "D"}


def proxy_of(comm):
    """The proxy a serving task belongs to, or None (the log thread is not on the path)."""
    if comm.startswith("nginx"):
        return "nginx"
    if comm.startswith("loopwarden") and not comm.startswith("loopwarden-log"):
        return "loopwarden"
    return None


# One proxied request: its proxy, when it ended (s), its class, the request cycle and the
# proxy's two turns (µs; None where the trace lacks the wake-up that starts one).
Request = namedtuple("Request", "proxy end cls cycle out back")


def requests(path):
    """Each proxied request, in order of its end (the proxy waking the driver)."""
    pending = {}  # proxy task -> {"mock": same CPU?, "out": µs, "back": µs}
    woken = {}  # proxy task -> what woke it
    running_since = {}  # proxy task -> (time it ran, what woke it)
    last_end = {}  # proxy task -> time of its previous answer
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            comm, pid, cpu, t, event, rest = m.groups()
            t, cpu = float(t), int(cpu)
            fields = dict(FIELD.findall(rest))
            if event == "sched_switch":
                nxt = fields.get("next_pid")
                if nxt in woken:
                    running_since[nxt] = (t, woken.pop(nxt))
                continue
            wakee = fields.get("comm", "")
            if proxy_of(wakee):
                # Only the driver's and the mock's wake-ups start a turn of the proxy.
                woken[fields["pid"]] = next((w for w in (DRIVER, MOCK) if comm.startswith(w)), None)
                continue
            proxy = proxy_of(comm)
            if not proxy or wakee not in (DRIVER, MOCK):
                continue
            same = int(fields["target_cpu"]) == cpu
            state = pending.setdefault(pid, {})
            since = running_since.get(pid)
            if wakee == MOCK:
                state["mock"] = same
                if since and since[1] == DRIVER:
                    state["out"] = (t - since[0]) * 1e6
                continue
            if since and since[1] == MOCK:
                state["back"] = (t - since[0]) * 1e6
            if "mock" in state and pid in last_end:
                yield Request(proxy, t, CLASS[(state["mock"], same)], (t - last_end[pid]) * 1e6,
                              state.get("out"), state.get("back"))
            last_end[pid] = t
            pending[pid] = {}


def windows(reqs, gap=0.3, warmup=float(os.environ.get("WARMUP", "0.5"))):
    """Runs of one proxy's requests with gaps under `gap` s, less their first `warmup` s."""
    runs = []
    for r in reqs:
        if runs and runs[-1][-1].proxy == r.proxy and r.end - runs[-1][-1].end < gap:
            runs[-1].append(r)
        else:
            runs.append([r])
    for w in runs:
        kept = [r for r in w if r.end >= w[0].end + warmup]
        if len(kept) >= 100:  # fewer: the harness's readiness checks, not a window
            yield kept


def summary(w):
    n = len(w)
    by = defaultdict(list)
    for r in w:
        by[r.cls].append(r.cycle)
    us = lambda xs: f"{median(xs):7.1f}" if xs else "      -"
    share = "".join(f"{len(by[c]) / n:6.0%}" for c in CLASSES)
    cycles = "".join(us(by[c]) for c in CLASSES)
    outs = [r.out for r in w if r.out is not None]
    backs = [r.back for r in w if r.back is not None]
    return f"{n:7}{share}{us([r.cycle for r in w])}{cycles}{us(outs)}{us(backs)}"


HEAD = ("      n" + "".join(f"{c:>6}" for c in CLASSES) + "  cycle" + "".join(f"{'cyc ' + c:>7}" for c in CLASSES)
        + "    out   back  (shares; medians, µs)")


def main():
    ws = list(windows(requests(sys.argv[1])))
    if not ws:
        print("sched_placement: no proxied c1 requests in the trace")
        return
    t0 = ws[0][0].end
    print(f"  start  proxy     {HEAD}")
    every = defaultdict(list)
    for w in ws:
        every[w[0].proxy].extend(w)
        print(f"{w[0].end - t0:7.1f}  {w[0].proxy:10}{summary(w)}")
    print()
    print("Over all windows")
    for proxy, w in sorted(every.items()):
        print(f"         {proxy:10}{summary(w)}")


if __name__ == "__main__":
    main()
