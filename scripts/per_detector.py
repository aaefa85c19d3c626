#!/usr/bin/env python3
"""Per-detector figures of a replay: for each detector, the runs where it led an
intervention, split by outcome, the halts/blocks it led, and what it hit among the
hand-labelled runs (a labelled loop counts when the detector intervened at or after its onset).

    loopwarden replay dev.jsonl > decisions.jsonl
    scripts/per_detector.py dev.jsonl decisions.jsonl dev_labels.jsonl
"""

import json
import sys
from collections import defaultdict

STOPS = {"halt", "block", "pause"}


def main(trajectories, decisions, labels):
    resolved = {}
    with open(trajectories, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                run = json.loads(line)
                resolved[run["id"]] = run.get("resolved")
    loops = {}
    with open(labels, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                lab = json.loads(line)
                loops[lab["id"]] = (lab["loop"], lab.get("onset_step") or 0)
    runs = defaultdict(set)  # detector -> runs it led an intervention in
    stops = defaultdict(lambda: [0, 0])  # detector -> [stops, stops on resolved runs]
    hits = defaultdict(set)  # detector -> labelled loops hit at/after onset
    false_hits = defaultdict(set)  # detector -> labelled non-loops hit
    first_stop = {}
    with open(decisions, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for d in rows:
        if d["action"] in STOPS:
            first_stop[d["id"]] = min(first_stop.get(d["id"], d["step"]), d["step"])
    for d in rows:
        rid, det, step = d["id"], d["detector"], d["step"]
        if rid in first_stop and step > first_stop[rid]:
            continue  # nothing after the first stop reaches the agent
        runs[det].add(rid)
        if d["action"] in STOPS and step == first_stop[rid]:
            stops[det][0] += 1
            stops[det][1] += resolved.get(rid) is True
        if rid in loops:
            is_loop, onset = loops[rid]
            if is_loop and step >= onset:
                hits[det].add(rid)
            elif not is_loop:
                false_hits[det].add(rid)
    print("| detector | runs it intervened on | resolved | unresolved | halts/blocks it led (on resolved) | labelled loops hit at/after onset | labelled non-loops hit |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for det in sorted(runs, key=lambda k: -len(runs[k])):
        rs = runs[det]
        res = sum(1 for r in rs if resolved.get(r) is True)
        unres = sum(1 for r in rs if resolved.get(r) is False)
        s, sr = stops[det]
        print(f"| {det} | {len(rs)} | {res} | {unres} | {s} ({sr}) | {len(hits[det])} | {len(false_hits[det])} |")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
