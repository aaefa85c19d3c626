#!/usr/bin/env python3
"""The table of a benchmark run (scripts/bench.sh): per load and peer, the median over the
rounds of each figure the load driver (examples/loadgen.rs) measured.

    scripts/bench_summary.py RUN_DIR

reads RUN_DIR/raw.jsonl (one driver line per run, labelled PEER|LOAD|ROUND), writes
RUN_DIR/summary.json ({"PEER|LOAD": {figure: value}}, what scripts/bench_ratios.py reads)
and prints the table in Markdown.
"""
import json
import os
import statistics
import sys


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs):
    """The figures of one peer on one load, over its rounds."""
    def proxy(r, key):
        return (r.get(key) or {}).get("proxy")
    rss = [proxy(r, "rss_peak_kb") for r in runs if proxy(r, "rss_peak_kb") is not None]
    return {
        "rounds": len(runs),
        "rps": med([r["rps"] for r in runs]),
        "p50": med([r["lat_ms"]["p50"] for r in runs]),
        "p99": med([r["lat_ms"]["p99"] for r in runs]),
        "ttfb50": med([r["ttfb_ms"]["p50"] for r in runs]),
        "ttft50": med([r["ttft_ms"]["p50"] for r in runs]) if runs[0]["ttft_ms"]["n"] else None,
        "cpu1k": med([proxy(r, "cpu_ms_per_req") for r in runs]),
        "mock_cpu1k": med([(r.get("cpu_ms_per_req") or {}).get("mock") for r in runs]),
        "rss_mb": max(rss) / 1024 if rss else None,
        "steal": med([r.get("steal_pct") for r in runs]),
        "errors": sum(r["errors"] for r in runs),
    }


def fmt(x, nd=3):
    return "–" if x is None else f"{x:.{nd}f}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    groups = {}
    with open(os.path.join(run, "raw.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            peer, load, _ = r["label"].split("|")
            groups.setdefault((peer, load), []).append(r)
    summary = {f"{peer}|{load}": summarize(runs) for (peer, load), runs in groups.items()}
    with open(os.path.join(run, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("CPU = the proxy's CPU ms per request; RSS = its peak resident memory; medians over rounds.")
    print()
    print("| load | peer | rps | p50 ms | p99 ms | first byte p50 ms | TTFT p50 ms | CPU ms/req | peak RSS MB | steal % | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key, m in summary.items():
        peer, load = key.split("|")
        print(f"| {load} | {peer} | {fmt(m['rps'], 1)} | {fmt(m['p50'])} | {fmt(m['p99'])} | "
              f"{fmt(m['ttfb50'])} | {fmt(m['ttft50'])} | {fmt(m['cpu1k'])} | {fmt(m['rss_mb'], 1)} | "
              f"{fmt(m['steal'], 1)} | {m['errors']} |")


if __name__ == "__main__":
    main()
