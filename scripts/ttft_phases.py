"""Reads `perf script` output of syscall tracepoints (scripts/ttft_phases.sh) and prints
the medians of each stream request's phases: upload, mock, download (see the script).

A request starts when the driver (`benchdrv`) writes more than 1 MB in one call (the
body); the mock (`mockup`) has the body once it has read 2 MB; the first token is the
mock's first 234-byte `writev` (one SSE event of the harness's streams); it arrives when
the driver next reads 200 bytes or more. Payloads under 2 MB are not split."""

import re
import statistics
import sys

LINE = re.compile(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)")


def calls(lines):
    """(start, end, comm, call, result) of the driver's and the mock's finished calls."""
    entered = {}
    out = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        comm, tid, t, edge, call, rest = m.groups()
        if not comm.startswith(("benchdrv", "mockup")):
            continue
        if edge == "enter":
            entered[tid] = (float(t), call)
        elif tid in entered:
            start, call = entered.pop(tid)
            result = int(rest, 16) if rest.startswith("0x") else int(rest)
            if result >= 1 << 63:
                result -= 1 << 64
            out.append((start, float(t), comm, call, result))
    out.sort()
    return out


def phases(events):
    requests, current = [], None
    for start, end, comm, call, result in events:
        driver = comm.startswith("benchdrv")
        if driver and call in ("write", "writev", "sendto") and result > 1_000_000:
            current = {"start": start, "mock_read": 0}
            requests.append(current)
        elif current is None:
            continue
        elif not driver and call in ("recvfrom", "read") and result > 0 and "body" not in current:
            current["mock_read"] += result
            if current["mock_read"] >= 2_000_000:
                current["body"] = end
        elif not driver and call == "writev" and result == 234 and "body" in current:
            current.setdefault("token", start)
        elif driver and call in ("recvfrom", "read") and result >= 200 and "token" in current:
            current.setdefault("got", end)
    done = [r for r in requests if "got" in r]
    return [
        (
            (r["body"] - r["start"]) * 1e3,
            (r["token"] - r["body"]) * 1e3,
            (r["got"] - r["token"]) * 1e3,
            (r["got"] - r["start"]) * 1e3,
        )
        for r in done
    ]


def main():
    rows = phases(calls(sys.stdin))
    if not rows:
        print("no complete request found (is the payload a 2 MB stream?)")
        return
    up, mock, down, total = (statistics.median(col) for col in zip(*rows))
    print(f"n={len(rows):3d}  upload {up:.3f}  mock {mock:.3f}  download {down:.3f}  total {total:.3f}")


if __name__ == "__main__":
    main()
