#!/usr/bin/env python3
"""Where a stream's first token waits, read off the wire (a loopback packet capture).

    scripts/ttft_wire.sh            # captures a bench run of the 2 MB streams and runs this
    python3 scripts/ttft_wire.py CAPTURE.pcap [PROXY_PORT=18090] [NGINX_PORT=18081] [MOCK_PORT=18080]

`scripts/ttft_phases.sh` splits a request by system calls on pinned cores; this reads the
packets of an ordinary (unpinned) harness run instead, so the split is of the very windows
the bench reports. Every HTTP/1.1 exchange on a connection is cut into: the client's first
and last payload packet of the request, the server's first payload packet of the response
(its head) and the first one carrying the stream's first token (the driver's marker
` token"`). Exchanges on the proxies' ports are the driver's; exchanges on the mock's port
are the direct peer's while no proxy window is open, else that proxy's upstream requests,
each matched with the client exchange whose first token follows its own soonest.

Per window (a peer's run of one load: exchanges with gaps under 0.3 s, less the driver's
warm-up, WARMUP=0.5 s), medians in ms of:
  ttft      client's first request byte -> first token at the client (what the driver sees,
            less its own write of the first bytes)
  up        client's first -> last request byte (the upload into the peer)
  turn      client's last request byte -> the peer's first byte upstream (its own work)
  fwd       the peer's first -> last byte upstream (its upload to the mock)
  mock      -> the mock's first token (the mock's 5 ms timer and its reading)
  back      the mock's first token -> the client's (the way back)
  path      ttft less the mock's part (everything a proxy can change)
Direct windows have only ttft, up and mock (the driver talks to the mock itself).
"""
import os
import struct
import sys
from collections import defaultdict
from statistics import median

MARK = b' token"'


def packets(path):
    """(time s, src port, dst port, payload length, captured payload) of each TCP packet."""
    with open(path, "rb") as f:
        head = f.read(24)
        magic = struct.unpack("<I", head[:4])[0]
        scale = 1e-9 if magic == 0xA1B23C4D else 1e-6
        link = struct.unpack("<I", head[20:24])[0]
        skip = {1: 14, 113: 16, 276: 20}.get(link, 14)  # ethernet, Linux cooked v1/v2
        while True:
            h = f.read(16)
            if len(h) < 16:
                return
            sec, frac, incl, _orig = struct.unpack("<IIII", h)
            data = f.read(incl)
            ip = data[skip:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            total = struct.unpack(">H", ip[2:4])[0]
            tcp = ip[ihl:]
            if len(tcp) < 20:
                continue
            sport, dport = struct.unpack(">HH", tcp[:4])
            off = (tcp[12] >> 4) * 4
            n = total - ihl - off
            if n > 0:
                yield sec + frac * scale, sport, dport, n, tcp[off:]


class Exchange:
    __slots__ = ("conn", "first", "last", "bytes", "head", "token", "api", "up")

    def __init__(self, conn, t, n, payload):
        self.conn = conn
        self.first = self.last = t
        self.bytes = n
        self.head = self.token = None
        self.api = "an" if payload.startswith(b"POST /v1/messages") else "oa"
        self.up = None  # the upstream exchange it was forwarded as


def exchanges(path, servers):
    """Exchanges per server port, in order of their first byte."""
    conns = defaultdict(list)  # (client port, server port) -> [Exchange]
    for t, sport, dport, n, payload in packets(path):
        if dport in servers:  # client -> server
            ex = conns[(sport, dport)]
            if not ex or ex[-1].head is not None:
                if payload.startswith(b"POST ") or payload.startswith(b"GET "):
                    ex.append(Exchange(sport, t, n, payload))
                continue
            ex[-1].last = t
            ex[-1].bytes += n
        elif sport in servers:
            ex = conns.get((dport, sport))
            if not ex:
                continue
            e = ex[-1]
            if e.head is None:
                e.head = t
            if e.token is None and MARK in payload:
                e.token = t
    out = defaultdict(list)
    for (_c, s), ex in conns.items():
        out[s].extend(e for e in ex if e.token is not None)
    for s in out:
        out[s].sort(key=lambda e: e.first)
    return out


def load_of(w):
    """The harness's name for a window's load (`an-2m-c4`), from its exchanges' request
    line, median request size and number of client connections."""
    api = max({"oa", "an"}, key=lambda a: sum(e.api == a for e in w))
    size = median(e.bytes for e in w)
    size = "2m" if size > 1e6 else "200k" if size > 1e5 else "8k"
    return f"{api}-{size}-c{len({e.conn for e in w})}"


def windows(ex, gap=0.3):
    """Runs of exchanges with gaps under `gap` s."""
    groups = []
    for e in ex:
        if groups and e.first - groups[-1][-1].first < gap:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def trim(w, warmup=float(os.environ.get("WARMUP", "0.5"))):
    """A window less its first `warmup` s (the driver leaves those out of its figures)."""
    return [e for e in w if e.first >= w[0].first + warmup] or w


PHASES = ("ttft", "up", "turn", "fwd", "mock", "back", "path")


def phases_of(e, direct):
    """One exchange's phases (s); a proxy's exchange with no matched upstream request has
    only the client's."""
    out = {"ttft": e.token - e.first, "up": e.last - e.first}
    if direct:
        out.update(mock=e.token - e.last, path=out["up"])
    elif e.up:
        u = e.up
        out.update(turn=u.first - e.last, fwd=u.last - u.first, mock=u.token - u.last,
                   back=e.token - u.token, path=out["ttft"] - (u.token - u.last))
    return out


def main():
    path = sys.argv[1]
    given = sys.argv[2:5]
    proxy, nginx, mock = map(int, given + ["18090", "18081", "18080"][len(given):])
    by = exchanges(path, {proxy, nginx, mock})
    spans = [(name, w) for port, name in ((proxy, "loopwarden"), (nginx, "nginx"))
             for w in windows(by.get(port, []))]
    # The mock's exchanges inside a proxy window are that proxy's upstream requests; the
    # others are the direct peer's.
    upstream = [[] for _ in spans]
    direct = []
    for u in by.get(mock, []):
        i = next((i for i, (_, w) in enumerate(spans) if w[0].first - 0.01 <= u.first <= w[-1].token + 0.01), None)
        (direct if i is None else upstream[i]).append(u)
    rows = []
    for (name, w), mine in zip(spans, upstream):
        free = sorted(w, key=lambda e: e.token)
        j = 0
        for u in sorted(mine, key=lambda u: u.token):  # relayed to the first client token after it
            while j < len(free) and free[j].token < u.token:
                j += 1
            if j < len(free):
                free[j].up = u
                j += 1
        rows.append((w[0].first, name, trim(w)))
    rows += [(w[0].first, "direct", trim(w)) for w in windows(direct)]
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0
    every = defaultdict(lambda: defaultdict(list))  # (load, peer) -> phase -> values
    ms = lambda xs: f"{median(xs) * 1e3:7.3f}" if xs else "      -"
    print("  start  peer        load           n" + "".join(f"{p:>8}" for p in PHASES) + "  (medians, ms)")
    for start, name, w in rows:
        if len(w) < 5:
            continue  # the harness's readiness checks, not a window
        load = load_of(w)
        mine = defaultdict(list)
        for e in w:
            for k, v in phases_of(e, name == "direct").items():
                mine[k].append(v)
        for k, xs in mine.items():
            every[(load, name)][k].extend(xs)
        print(f"{start - t0:7.1f}  {name:10}  {load:11} {len(w):4}  " + " ".join(ms(mine[k]) for k in PHASES))
    print()
    print("Over all windows (medians of every exchange, ms)")
    print("load         peer          n" + "".join(f"{p:>8}" for p in PHASES) + "  path − nginx's")
    for (load, name), ph in sorted(every.items()):
        ng = every.get((load, "nginx"), {}).get("path")
        extra = f"{(median(ph['path']) - median(ng)) * 1e3:7.3f}" if ng and ph["path"] else "      -"
        print(f"{load:11}  {name:10} {len(ph['ttft']):4}  " + " ".join(ms(ph[k]) for k in PHASES) + f" {extra}")


if __name__ == "__main__":
    main()
