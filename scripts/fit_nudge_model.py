#!/usr/bin/env python3
"""Fits a small logistic model that would decide whether a nudge is earned, and scores it
leave-one-agent-out: the check behind EVALUATION.md's "Tried" row for a calibrated model.

Reads the per-step explanation of every run (`loopwarden replay FILE --explain '*'`, which
prints each call's novelty and each step's facts) and, for every intervention the shipped
engine makes, a handful of interpretable features of the steps before it:

    since_source   steps since a source file last reached a new state (capped at 12)
    novel5         content lines never seen before, shown in the last 5 steps (log1p)
    new_steps5     steps of the last 5 that returned something new
    changed5       steps of the last 5 that changed a file
    quiet          steps since the last change or new result
    verified       the code holds a change a check has passed
    confidence     the leading finding's confidence

An intervention is a positive when it is the first at or after the onset of a labelled
loop, a negative when it is the first in a run that was resolved (a nudge the run did not
need). The model is fitted by plain gradient descent (python stdlib) on five families and
scored on the sixth: at the threshold that keeps 95% of the positives of the five, the
share of the sixth's negatives it would suppress and of its positives it would lose.

    scripts/fit_nudge_model.py                # replays with target/eval/loopwarden
    scripts/fit_nudge_model.py --explained DIR  # or reads DIR/{dev,dev2,fresh,cc}.txt

The scores are of the first interventions only (a suppressed nudge may come back a step
later in the engine), so they bound what such a gate could do rather than measure it.
"""

import argparse
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
FILES = ("dev", "dev2", "fresh", "cc")
FEATURES = ("since_source", "novel5", "new_steps5", "changed5", "quiet", "verified",
            "confidence")

CALL = re.compile(r"^\s*(\d+) \w+ .*? \| check=.*? new=(\w+) lines=(\d+)/(\d+) "
                  r"changed=(\w+) rep=\w+ \| ")
STEP = re.compile(r"^    \. step (\d+): changed=(\w+) new=(\w+) rejected=\w+ quiet=(\d+) "
                  r"last_new_source=(?:None|Some\((\d+)\)) fix_verified=(\w+)")
FINDING = re.compile(r"^      finding (\w+) ([\d.]+): ")
DECISION = re.compile(r"^  ==> request (\d+): (\w+) \((\w*)\)")


def parse(path):
    """{run id: {"steps": {k: facts}, "novel": {k: lines}, "finds": {k: [(det, conf)]},
    "decisions": [(request, action, detector)]}}"""
    runs, cur, last = {}, None, None
    with open(path) as f:
        for line in f:
            if line.startswith("# "):
                cur = runs[line[2:].strip()] = {"steps": {}, "novel": {}, "finds": {},
                                                 "decisions": []}
                continue
            m = CALL.match(line)
            if m:
                k = int(m[1])
                cur["novel"][k] = cur["novel"].get(k, 0) + int(m[3])
                continue
            m = STEP.match(line)
            if m:
                last = int(m[1])
                cur["steps"][last] = {"changed": m[2] == "true", "new": m[3] == "true",
                                      "quiet": int(m[4]),
                                      "source": int(m[5]) if m[5] else None,
                                      "verified": m[6] == "true"}
                continue
            m = FINDING.match(line)
            if m:
                cur["finds"].setdefault(last, []).append((m[1], float(m[2])))
                continue
            m = DECISION.match(line)
            if m:
                cur["decisions"].append((int(m[1]), m[2], m[3]))
    return runs


def features(run, k, detector):
    st = run["steps"].get(k, {})
    window = range(k - 4, k + 1)
    steps = [run["steps"].get(j, {}) for j in window]
    conf = max((c for d, c in run["finds"].get(k, []) if d == detector), default=0.0)
    source = st.get("source")
    return [min(k - source, 12) if source is not None else 12,
            math.log1p(sum(run["novel"].get(j, 0) for j in window)),
            sum(s.get("new", False) for s in steps),
            sum(s.get("changed", False) for s in steps),
            min(st.get("quiet", 0), 12),
            float(st.get("verified", False)),
            conf]


def examples(runs, meta, labels):
    """(agent, features, positive) for the first intervention of each resolved run and the
    first at or after the onset of each labelled loop."""
    out = []
    for rid, run in runs.items():
        acts = sorted(d for d in run["decisions"] if d[1] != "observe")
        if not acts:
            continue
        agent = meta[rid]["agent"]
        lab = labels.get(rid)
        if lab and lab["loop"]:
            after = [a for a in acts if a[0] >= lab["onset"]]
            if after:
                q, _, det = after[0]
                out.append((agent, features(run, q - 1, det), True))
        if meta[rid]["resolved"] is True:
            q, _, det = acts[0]
            out.append((agent, features(run, q - 1, det), False))
    return out


def standardize(rows):
    n = len(FEATURES)
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(n)]
    sd = [math.sqrt(sum((r[i] - mean[i]) ** 2 for r in rows) / len(rows)) or 1.0
          for i in range(n)]
    return mean, sd


def fit(xs, ys, steps=3000, rate=0.1, l2=0.01):
    """Logistic regression by batch gradient descent on standardized features."""
    mean, sd = standardize(xs)
    zs = [[(x[i] - mean[i]) / sd[i] for i in range(len(FEATURES))] for x in xs]
    w, b = [0.0] * len(FEATURES), 0.0
    for _ in range(steps):
        gw, gb = [l2 * wi for wi in w], 0.0
        for z, y in zip(zs, ys):
            p = 1 / (1 + math.exp(-(b + sum(wi * zi for wi, zi in zip(w, z)))))
            for i, zi in enumerate(z):
                gw[i] += (p - y) * zi / len(zs)
            gb += (p - y) / len(zs)
        w = [wi - rate * g for wi, g in zip(w, gw)]
        b -= rate * gb
    return mean, sd, w, b


def predict(model, x):
    mean, sd, w, b = model
    z = sum(wi * (xi - m) / s for wi, xi, m, s in zip(w, x, mean, sd))
    return 1 / (1 + math.exp(-(b + z)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "eval", "loopwarden"))
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "trajectories"))
    ap.add_argument("--explained", help="a directory of `--explain '*'` outputs")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(SHARED, "eval"))
    import score  # noqa: E402  (the reference scorer, beside the data)

    rows = []
    for name in FILES:
        path = os.path.join(a.data, name + ".jsonl")
        if a.explained:
            text = os.path.join(a.explained, name + ".txt")
        else:
            text = os.path.join("/tmp", f"explain-{os.getpid()}-{name}.txt")
            with open(text, "w") as err:
                subprocess.run([a.binary, "replay", path, "--explain", "*"], check=True,
                               stdout=subprocess.DEVNULL, stderr=err)
        rows += examples(parse(text), score.load_runs(path),
                         score.load_labels(os.path.join(a.data, name + "_labels.jsonl")))
    agents = sorted({r[0] for r in rows})
    print(f"{len(rows)} examples: {sum(r[2] for r in rows)} caught loops, "
          f"{sum(not r[2] for r in rows)} first nudges of resolved runs")
    print("held out        negatives suppressed   positives lost")
    tot = [0, 0, 0, 0]
    for agent in agents:
        train = [r for r in rows if r[0] != agent]
        test = [r for r in rows if r[0] == agent]
        model = fit([r[1] for r in train], [float(r[2]) for r in train])
        pos = sorted(predict(model, r[1]) for r in train if r[2])
        cut = pos[int(0.05 * len(pos))] if pos else 0.5
        neg_t = [r for r in test if not r[2]]
        pos_t = [r for r in test if r[2]]
        sup = sum(predict(model, r[1]) < cut for r in neg_t)
        lost = sum(predict(model, r[1]) < cut for r in pos_t)
        tot = [tot[0] + sup, tot[1] + len(neg_t), tot[2] + lost, tot[3] + len(pos_t)]
        print(f"{agent:15} {sup:3} of {len(neg_t):3}            {lost:3} of {len(pos_t):3}")
    print(f"{'all':15} {tot[0]:3} of {tot[1]:3}            {tot[2]:3} of {tot[3]:3}")
    model = fit([r[1] for r in rows], [float(r[2]) for r in rows])
    print("coefficients (all families, standardized features):")
    for name, w in zip(FEATURES, model[2]):
        print(f"  {name:14} {w:+.3f}")
    print(f"  {'intercept':14} {model[3]:+.3f}")


if __name__ == "__main__":
    main()
