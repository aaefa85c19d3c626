#!/usr/bin/env python3
"""Issue-5 ratios from a harness run directory (summary.json written by summarize.py).

    scripts/bench_ratios.py RUN_DIR [LOG_DB]

Prints, per load, loopwarden against nginx: CPU per request (target: <= 4x on 8.8 KB,
<= 2.5x on 209 KB and 2 MB), added p50 latency over a direct connection (<= 2x nginx's),
time to first token on streams (<= nginx + 0.3 ms), and peak memory (< 64 MB at 64
concurrent 209 KB requests). With LOG_DB (or the loopwarden-*.db the run wrote), also
the proxy's own overhead as it logged it (requests.proxy_overhead_us, and without the
request body's arrival, requests.body_read_us), per request size.
"""
import glob
import json
import os
import sqlite3
import sys

# OURS: the peer measured against nginx (`policies`: loopwarden with ten policies).
OURS, REF, DIRECT = os.environ.get("OURS", "loopwarden"), "nginx", "direct"


def load_summary(run):
    """A run's summary.json: {"<peer>|<load>": {metric: value}}."""
    return json.load(open(os.path.join(run, "summary.json")))


def loads_of(summary):
    seen = []
    for key in summary:
        load = key.split("|")[1]
        if load not in seen:
            seen.append(load)
    return seen


def metric(summary, peer, load, k):
    m = summary.get(f"{peer}|{load}")
    return None if m is None else m.get(k)


def size_of(load):
    return load.split("-")[1]


def cpu_target(load):
    return 4.0 if size_of(load) == "8k" else 2.5


ADDED_P50_TARGET = 2.0
TTFT_TARGET_MS = 0.3


# Whether a figure is within its target: the one place each target is applied.
def cpu_within(load, ratio):
    return ratio <= cpu_target(load)


def added_p50_within(load, ratio):
    return ratio <= ADDED_P50_TARGET


def ttft_within(load, delta):
    return delta <= TTFT_TARGET_MS


def cpu_ratio(summary, load):
    """(nginx's CPU ms per request, loopwarden's, their ratio)."""
    c_ref, c_us = metric(summary, REF, load, "cpu1k"), metric(summary, OURS, load, "cpu1k")
    ratio = c_us / c_ref if (c_us is not None and c_ref) else None
    return c_ref, c_us, ratio


def added_p50(summary, load):
    """(nginx's p50 over the direct connection's, loopwarden's, their ratio)."""
    d = metric(summary, DIRECT, load, "p50")
    p_ref, p_us = metric(summary, REF, load, "p50"), metric(summary, OURS, load, "p50")
    a_ref = p_ref - d if (d is not None and p_ref is not None) else None
    a_us = p_us - d if (d is not None and p_us is not None) else None
    # An added latency below 10 µs is within the timer's noise: no meaningful ratio.
    ratio = a_us / a_ref if (a_us is not None and a_ref is not None and a_ref > 0.01) else None
    return a_ref, a_us, ratio


def ttft_over_nginx(summary, load):
    """loopwarden's time to first token (p50) minus nginx's, ms."""
    t_ref, t_us = metric(summary, REF, load, "ttft50"), metric(summary, OURS, load, "ttft50")
    return t_us - t_ref if (t_us is not None and t_ref is not None) else None


def fmt(x, nd=3):
    return "–" if x is None else f"{x:.{nd}f}"


def verdict(ok):
    return "–" if ok is None else ("ok" if ok else "**over**")


def main():
    run = sys.argv[1]
    S = load_summary(run)
    loads = loads_of(S)

    out = []
    P = out.append
    have_ref = any(k.startswith(REF + "|") for k in S)
    if not any(k.startswith(OURS + "|") for k in S):
        print("no loopwarden results in", run)
        sys.exit(1)

    P("### loopwarden against nginx (issue 5 targets)")
    P("")
    if not have_ref:
        P("nginx was not measured (not installed?): ratios cannot be computed.")
        P("")
    P("CPU = proxy process CPU milliseconds per request (median of rounds); +p50 = p50 latency minus the "
      "direct connection's; TTFT = time to the first streamed token, p50.")
    P("")
    P(f"| load | CPU ms/req nginx | CPU ms/req loopwarden | ratio | target | | +p50 ms nginx | +p50 ms loopwarden | ratio (≤ {ADDED_P50_TARGET:g}) | peak RSS MB |")
    P("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for load in loads:
        c_ref, c_us, ratio = cpu_ratio(S, load)
        a_ref, a_us, a_ratio = added_p50(S, load)
        P(f"| {load} | {fmt(c_ref)} | {fmt(c_us)} | {fmt(ratio, 2)} | ≤ {cpu_target(load)} | "
          f"{verdict(None if ratio is None else cpu_within(load, ratio))} | {fmt(a_ref)} | {fmt(a_us)} | "
          f"{fmt(a_ratio, 2)} | {fmt(metric(S, OURS, load, 'rss_mb'), 1)} |")
    P("")

    streams = [l for l in loads if "sse" in l]
    if streams:
        P("The last column is not a target: the time to the answer's first bytes (its headers and "
          "opening event, without a token), which the mock sends as soon as it has read the body, "
          "before its 5 ms timer. It reads the same path as the first token without the timer's "
          "jitter, which is most of the first token's spread. Steal is the share of the "
          "machine's CPU time the host gave to others during each peer's windows (median): "
          "a few percent of it raises every phase of a request, more so for the proxy that "
          "works more on the path (BENCHMARKS.md, \"Method\"), so a cell whose peers "
          "took different steal compares the host as much as the proxies.")
        P("")
        P(f"| stream load | TTFT p50 direct | TTFT p50 nginx | TTFT p50 loopwarden | loopwarden − nginx ms (≤ {TTFT_TARGET_MS:g}) | | first bytes: loopwarden − nginx ms | steal % nginx / loopwarden |")
        P("|---|---:|---:|---:|---:|---|---:|---:|")
        for load in streams:
            t_d, t_ref, t_us = (metric(S, p, load, "ttft50") for p in (DIRECT, REF, OURS))
            delta = ttft_over_nginx(S, load)
            h_ref, h_us = (metric(S, p, load, "ttfb50") for p in (REF, OURS))
            h_delta = h_us - h_ref if (h_us is not None and h_ref is not None) else None
            steal = " / ".join(fmt(metric(S, p, load, "steal"), 1) for p in (REF, OURS))
            P(f"| {load} | {fmt(t_d)} | {fmt(t_ref)} | {fmt(t_us)} | {fmt(delta)} | "
              f"{verdict(None if delta is None else ttft_within(load, delta))} | {fmt(h_delta)} | {steal} |")
        P("")

    rss = [(metric(S, OURS, l, "rss_mb"), l) for l in loads if metric(S, OURS, l, "rss_mb") is not None]
    if rss:
        top, at = max(rss)
        P(f"Peak RSS of loopwarden over all loads: {top:.1f} MB (during {at}); "
          f"nginx: {max((metric(S, REF, l, 'rss_mb') or 0) for l in loads):.1f} MB.")
        c64 = [l for l in loads if size_of(l) == "200k" and l.endswith("-c64")]
        for l in c64:
            r = metric(S, OURS, l, "rss_mb")
            P(f"At 64 concurrent 209 KB requests ({l}): {r:.1f} MB (target < 64 MB: {verdict(r < 64)}).")
        P("")

    db = sys.argv[2] if len(sys.argv) > 2 else None
    if db is None:
        stamp = os.path.basename(os.path.normpath(run))
        cands = glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.normpath(run))), f"loopwarden-{stamp}.db"))
        db = cands[0] if cands else None
    if db and os.path.exists(db):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        # body_read_us: logs written before that column existed have none.
        cols = [r[1] for r in con.execute("PRAGMA table_info(requests)")]
        read_col = "body_read_us" if "body_read_us" in cols else "NULL"
        rows = con.execute(f"SELECT request_bytes, stream, proxy_overhead_us, {read_col} FROM requests").fetchall()
        buckets = {}
        for size, stream, us, read in rows:
            label = "8.8 KB" if size < 50_000 else "209 KB" if size < 1_000_000 else "2 MB"
            buckets.setdefault((label, "stream" if stream else "plain"), []).append((us, read))
        if buckets:
            P("The proxy's own overhead as it logged it (`requests.proxy_overhead_us`: time in the proxy "
              "minus time waiting for the upstream, including the request body's arrival, "
              "`requests.body_read_us`, which is the client sending; the last columns are the overhead "
              "without it, the proxy's own work):")
            P("")
            P("| request | requests | p50 µs | p99 µs | body arrival p50 µs | without it p50 µs | without it p99 µs |")
            P("|---|---:|---:|---:|---:|---:|---:|")
            order = {"8.8 KB": 0, "209 KB": 1, "2 MB": 2}

            def quantiles(xs):
                xs = sorted(xs)
                if not xs:
                    return ("–", "–")
                pick = lambda q: xs[min(len(xs) - 1, round((len(xs) - 1) * q))]
                return (pick(0.5), pick(0.99))

            for (label, kind), pairs in sorted(buckets.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
                p50, p99 = quantiles([us for us, _ in pairs])
                read50, _ = quantiles([r for _, r in pairs if r is not None])
                own50, own99 = quantiles([us - r for us, r in pairs if r is not None])
                P(f"| {label} {kind} | {len(pairs)} | {p50} | {p99} | {read50} | {own50} | {own99} |")
            P("")

    print("\n".join(out))


if __name__ == "__main__":
    main()
