#!/usr/bin/env python3
"""Which detectors take a run over when one is silenced (docs/detectors.md, "Overlap").

Replays the recorded runs with the shipped config, then once per detector with that
detector off (`[detect.patterns.NAME] response = "off"`), and for each detector X prints:

- led: the runs in which X led an intervention that reached the agent (at or before the
  run's first halt, pause or block) with the shipped config;
- stops led: of those, the runs whose first stop X led;
- with X off, on the runs X led: how many still get an intervention, and from which
  detectors (runs per detector, most first); and for the runs whose stop X led, who leads
  the stop now (or `none`).

    cargo build --profile eval
    scripts/detector_overlap.py                      # the four files of ../shared/data/trajectories
    scripts/detector_overlap.py --files dev          # one of them
    scripts/detector_overlap.py --keep /tmp/overlap  # keep the decisions (rerun reuses them)
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "..", "shared", "data", "trajectories")
STOPS = {"halt", "pause", "block"}


def detectors(binary, workdir):
    """The registered detectors, as the binary names them: a config naming none of them
    is refused with the list."""
    bad = os.path.join(workdir, "unknown.toml")
    with open(bad, "w") as f:
        f.write('[detect.patterns.no_such_detector]\nresponse = "off"\n')
    empty = os.path.join(workdir, "empty.jsonl")
    open(empty, "w").close()
    out = subprocess.run([binary, "replay", empty, "--config", bad],
                         capture_output=True, text=True)
    m = re.search(r"the detectors: ([a-z_, ]+)", out.stderr)
    if not m:
        sys.exit(f"could not read the detectors' names from: {out.stderr.strip()}")
    return [d.strip() for d in m.group(1).split(",") if d.strip()]


def replay(binary, files, config_text, out_path):
    """Decisions of every file with a config (cached in out_path)."""
    if os.path.exists(out_path):
        return load(out_path)
    config = out_path + ".toml"
    with open(config, "w") as f:
        f.write(config_text)
    with open(out_path + ".part", "w") as out:
        for path in files:
            subprocess.run([binary, "replay", path, "--config", config], stdout=out, check=True)
    os.replace(out_path + ".part", out_path)
    return load(out_path)


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def effective(decisions):
    """Per run: the detectors that led an intervention the agent received, and the
    detector of the first stop (None if the run was not stopped)."""
    first_stop = {}
    for d in decisions:
        if d["action"] in STOPS:
            first_stop[d["id"]] = min(first_stop.get(d["id"], d["step"]), d["step"])
    led, stop = defaultdict(set), {}
    for d in decisions:
        rid = d["id"]
        if rid in first_stop and d["step"] > first_stop[rid]:
            continue
        led[rid].add(d["detector"])
        if d["action"] in STOPS and d["step"] == first_stop[rid]:
            stop[rid] = d["detector"]
    return led, stop


def spread(counter, total):
    if not counter:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in counter.most_common()) + f" (of {total})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    ap.add_argument("--binary", default=os.path.join(target, "eval", "loopwarden"))
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--files", nargs="+", default=["dev", "dev2", "fresh", "cc"])
    ap.add_argument("--keep", help="directory for the decisions (reused when present)")
    args = ap.parse_args()
    files = [os.path.join(args.data, f + ".jsonl") for f in args.files]
    workdir = args.keep or tempfile.mkdtemp(prefix="overlap-")
    os.makedirs(workdir, exist_ok=True)
    names = detectors(args.binary, workdir)
    tag = "-".join(args.files)
    base_led, base_stop = effective(replay(args.binary, files, "", os.path.join(workdir, f"{tag}-shipped.jsonl")))

    print(f"runs replayed from {', '.join(args.files)}; runs with an intervention: {len(base_led)}, stopped: {len(base_stop)}\n")
    print("| detector off | runs it led | still intervened on | now led by (runs) | stops it led | now stopped by (runs) |")
    print("|---|---:|---:|---|---:|---|")
    for name in names:
        mine = sorted(r for r, ds in base_led.items() if name in ds)
        my_stops = sorted(r for r, d in base_stop.items() if d == name)
        if not mine:
            print(f"| {name} | 0 | | | 0 | |")
            continue
        off = f'[detect.patterns.{name}]\nresponse = "off"\n'
        led, stop = effective(replay(args.binary, files, off, os.path.join(workdir, f"{tag}-no-{name}.jsonl")))
        by = Counter(d for r in mine for d in led.get(r, ()))
        still = sum(1 for r in mine if led.get(r))
        stops_now = Counter(stop.get(r, "none") for r in my_stops)
        print(f"| {name} | {len(mine)} | {still} | {spread(by, len(mine))} | {len(my_stops)} | "
              f"{spread(stops_now, len(my_stops)) if my_stops else ''} |")


if __name__ == "__main__":
    main()
