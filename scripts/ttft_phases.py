"""Reads `perf script` output of syscall tracepoints (scripts/ttft_phases.sh) and prints
the medians of each stream request's phases: upload (split into in, work and out), mock,
download (see the script), and how the proxy read the body: how many reads, and how long
after the driver's last written byte the last one ended ("lag"; a proxy that keeps pace
with the client has it right after). The argument is the proxy's pid.

A request starts when the driver (`benchdrv`) writes more than 1 MB in one call (the
body); the proxy has the body once it has read 2 MB, and starts sending it upstream with
its first write of more than 50 KB after that; the mock (`mockup`) has the body once it
has read 2 MB; the first token is the mock's first 234-byte `writev` (one SSE event of the
harness's streams); it arrives when the driver next reads 200 bytes or more. Payloads
under 2 MB are not split."""

import re
import statistics
import sys

LINE = re.compile(
    r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)"
)
READS = ("recvfrom", "read")
WRITES = ("write", "writev", "sendto")


def calls(lines, proxy_pid):
    """(start, end, who, call, result) of the driver's, the mock's and the proxy's
    finished calls; `who` is "driver", "mock" or "proxy"."""
    entered = {}
    out = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, t, edge, call, rest = m.groups()
        if comm.startswith("benchdrv"):
            who = "driver"
        elif comm.startswith("mockup"):
            who = "mock"
        elif pid == proxy_pid:
            who = "proxy"
        else:
            continue
        if edge == "enter":
            entered[tid] = (float(t), call)
        elif tid in entered:
            start, call = entered.pop(tid)
            result = int(rest, 16) if rest.startswith("0x") else int(rest)
            if result >= 1 << 63:
                result -= 1 << 64
            out.append((start, float(t), who, call, result))
    out.sort()
    return out


def phases(events):
    requests, current = [], None
    for start, end, who, call, result in events:
        if result <= 0:
            continue
        if who == "driver" and call in WRITES and result > 1_000_000:
            current = {
                "start": start,
                "written": end,
                "reads": 0,
                "proxy_read": 0,
                "mock_read": 0,
            }
            requests.append(current)
        elif current is None:
            continue
        elif who == "proxy" and call in READS and "arrived" not in current:
            current["proxy_read"] += result
            current["reads"] += 1
            if current["proxy_read"] >= 2_000_000:
                current["arrived"] = end
        elif who == "proxy" and call in WRITES and result > 50_000 and "arrived" in current:
            current.setdefault("sending", start)
        elif who == "mock" and call in READS and "body" not in current:
            current["mock_read"] += result
            if current["mock_read"] >= 2_000_000:
                current["body"] = end
        elif who == "mock" and call == "writev" and result == 234 and "body" in current:
            current.setdefault("token", start)
        elif who == "driver" and call in READS and result >= 200 and "token" in current:
            current.setdefault("got", end)
    keys = ("arrived", "sending", "body", "token", "got")
    done = [r for r in requests if all(k in r for k in keys)]
    return [
        (
            (r["body"] - r["start"]) * 1e3,
            (r["arrived"] - r["start"]) * 1e3,
            (r["sending"] - r["arrived"]) * 1e3,
            (r["body"] - r["sending"]) * 1e3,
            (r["token"] - r["body"]) * 1e3,
            (r["got"] - r["token"]) * 1e3,
            (r["got"] - r["start"]) * 1e3,
            r["reads"],
            (r["arrived"] - r["written"]) * 1e3,
        )
        for r in done
    ]


def main():
    rows = phases(calls(sys.stdin, sys.argv[1]))
    if not rows:
        print("no complete request found (is the payload a 2 MB stream?)")
        return
    up, into, work, out, mock, down, total, reads, lag = (
        statistics.median(col) for col in zip(*rows)
    )
    print(
        f"n={len(rows):3d}  upload {up:.3f} (in {into:.3f} work {work:.3f} out {out:.3f})"
        f"  mock {mock:.3f}  download {down:.3f}  total {total:.3f}"
        f"  | reads {reads:.0f}, lag {lag:.3f}"
    )


if __name__ == "__main__":
    main()
