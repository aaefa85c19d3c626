#!/usr/bin/env python3
"""The issue-5 figures of several full runs side by side, with each load's median.

    scripts/bench_runs.py RUN_DIR [RUN_DIR ...]
    scripts/bench_runs.py $(ls -d /tmp/loopwarden-bench/results/2026* | tail -4)

One run's ratios (scripts/bench_ratios.py) move from run to run on shared cores: the
loads over a target in one run are within it in the next. Per load and per target this
prints every run's figure, their median, and in how many runs the figure was within the
target, so that a load that is over in most runs stands apart from one that was over
once. Runs without nginx, or without the load, are left out of that load's figures.
"""
import statistics
import sys

from bench_ratios import (
    ADDED_P50_TARGET,
    TTFT_TARGET_MS,
    added_p50,
    added_p50_within,
    cpu_ratio,
    cpu_within,
    fmt,
    load_summary,
    loads_of,
    ttft_over_nginx,
    ttft_within,
    verdict,
)


def row(load, values, within):
    """A table row: the runs' figures, their median, its verdict, and the count within."""
    got = [v for v in values if v is not None]
    cells = " | ".join(fmt(v, 2) for v in values)
    if not got:
        return f"| {load} | {cells} | – | – | – |"
    med = statistics.median(got)
    ok = sum(1 for v in got if within(load, v))
    return f"| {load} | {cells} | {fmt(med, 2)} | {verdict(within(load, med))} | {ok} of {len(got)} |"


def table(title, runs, summaries, loads, figure, within):
    """One target's table: per load, `figure(summary, load)` in every run."""
    names = " | ".join(r.rstrip("/").split("/")[-1] for r in runs)
    dashes = "|".join("---:" for _ in runs)
    print(f"### {title}")
    print()
    print(f"| load | {names} | median | | within target |")
    print(f"|---|{dashes}|---:|---|---:|")
    for load in loads:
        print(row(load, [figure(s, load) for s in summaries], within))
    print()


def main():
    runs = sys.argv[1:]
    if not runs:
        sys.exit(__doc__)
    summaries = [load_summary(r) for r in runs]
    loads = []
    for s in summaries:
        loads += [l for l in loads_of(s) if l not in loads]

    table("CPU per request, loopwarden / nginx", runs, summaries, loads,
          lambda s, load: cpu_ratio(s, load)[2], cpu_within)
    table(f"Added p50 latency, loopwarden / nginx (target ≤ {ADDED_P50_TARGET:g})", runs,
          summaries, loads, lambda s, load: added_p50(s, load)[2], added_p50_within)
    streams = [l for l in loads if "sse" in l]
    if streams:
        table(f"Time to first token, loopwarden − nginx, ms (target ≤ {TTFT_TARGET_MS:g})",
              runs, summaries, streams, ttft_over_nginx, ttft_within)


if __name__ == "__main__":
    main()
