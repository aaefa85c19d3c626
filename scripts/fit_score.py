#!/usr/bin/env python3
"""Fits the calibrated score (`src/detect/score.rs`) and scores it leave-one-family-out.

The score's meaning: the chance that the request after a step comes inside a loop a reader
labelled (at or after the loop's onset, up to its end), given the facts the proxy folds per
request. It is fitted on the steps of the 585 hand-labelled runs, the only ones where a
step's label is known; its thresholds are chosen on every run of the training families,
since what they trade (resolved runs nudged or halted against loops caught and steps saved)
is measured on all of them.

    scripts/fit_score.py                      # replays with target/eval/loopwarden into
                                              # /tmp/lw-score-cache (once), then fits
    scripts/fit_score.py --cache DIR          # the `--explain '*'` outputs kept there
    scripts/fit_score.py --form trees         # gradient-boosted trees instead of logistic
    scripts/fit_score.py --replay             # + each family replayed by the proxy with the
                                              #   model fitted without it (checks the
                                              #   simulation decision for decision)
    scripts/fit_score.py --write              # + writes the model fitted on all seven
                                              #   families to src/detect/score_model.json

Needs scikit-learn and numpy (a venv: `python3 -m venv V && V/bin/pip install scikit-learn`).

Features: what `loopwarden replay --explain` prints on each step's `score` line (the proxy
computes them, so the fit reads exactly what the proxy will). Leave-one-family-out: for each
of the seven families (a run's `agent`), the model is fitted on the other six families'
labelled steps, its thresholds are chosen on their runs, and the family's runs are decided
with it; the decisions are those the engine makes (the same rule, simulated on the cached
features; `--replay` runs the proxy to check it) and are scored by the reference scorer
(../shared/eval/score.py), pooled.
"""

import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
FILES = ("dev", "dev2", "fresh", "cc", "tb")
MODEL = os.path.join(ROOT, "src", "detect", "score_model.json")
CHECKS = os.path.join(ROOT, "src", "detect", "score_checks.json")
MEANING = ("P(the request after this step comes inside a hand-labelled loop: at or after its "
           "onset, up to its end), from the facts folded up to this step")

# The engine's ladder settings the score's decisions share (`[detect.escalation]` defaults).
COOLDOWN = 5
GAP = 2
# Threshold grids: nudge at a, stop at b >= a (2.0: never).
NUDGE_GRID = [round(0.05 * i, 2) for i in range(4, 19)]
STOP_GRID = [round(0.05 * i, 2) for i in range(8, 20)] + [0.97, 0.99, 2.0]
# Harm bounds a choice must hold on the training families (the targets).
MAX_LOST_FIX = 0.01
MAX_FALSE_HALT = 0.01
MAX_RES_NUDGED = 0.10
BALANCE = False


def load_scorer():
    sys.path.insert(0, os.path.join(SHARED, "eval"))
    import score  # noqa: E402  (the reference scorer, beside the data)

    return score


def explain(binary, data, cache, name):
    """The `--explain '*'` output of one file (and the shipped ladder's decisions), cached."""
    text = os.path.join(cache, name + ".txt")
    if not os.path.exists(text):
        os.makedirs(cache, exist_ok=True)
        with open(text + ".part", "w") as err, \
                open(os.path.join(cache, name + ".ladder.jsonl"), "w") as out:
            subprocess.run([binary, "replay", os.path.join(data, name + ".jsonl"),
                            "--explain", "*"], check=True, stdout=out, stderr=err)
        os.rename(text + ".part", text)
    return text


def parse(path):
    """{run id: [step]} with step = (index, working, human, recalled, hard, features);
    and the feature names."""
    runs, cur, names, k = {}, None, None, -1
    with open(path) as f:
        for line in f:
            if line.startswith("## score features: "):
                names = line.split(": ", 1)[1].strip().split(",")
            elif line.startswith("# "):
                cur = runs[line[2:].strip()] = []
            elif line.startswith("    . step "):
                k = int(line[11:line.index(":", 11)])
            elif line.startswith("    score "):
                fields = dict(kv.split("=", 1) for kv in line.split()[1:])
                x = [float(v) for v in fields["x"].split(",")]
                cur.append((k, fields["working"] == "1", fields["human"] == "1",
                            fields["recalled"] == "1", fields["hard"] == "1", x))
    return runs, names


def step_labels(steps, label):
    """1 where the request after the step lies inside the labelled loop, else 0."""
    if not label or not label.get("loop"):
        return [0] * len(steps)
    onset, end = label["onset_step"], label.get("end_step")
    return [int(onset <= k + 1 and (end is None or k + 1 <= end)) for k, *_ in steps]


class Model:
    """An exported model: the same arithmetic as `ScoreModel::probability_of` in Rust."""

    def __init__(self, names, form):
        self.names, self.form = names, form

    def z(self, x):
        f = self.form
        if f["kind"] == "logistic":
            s = 0.0
            for w, v in zip(f["weights"], x):
                s += w * v
            return f["intercept"] + s
        s = 0.0
        for t in f["trees"]:
            s += leaf(t, x)
        return f["base"] + s

    def p(self, x):
        return 1.0 / (1.0 + math.exp(-self.z(x)))


def leaf(t, x):
    import numpy as np

    node = 0
    while t["left"][node] >= 0:
        v = float(np.float32(x[t["feature"][node]]))
        node = t["left"][node] if v <= t["threshold"][node] else t["right"][node]
    return t["value"][node]


def fit(xs, ys, ws, names, form):
    """Fits on the labelled steps; returns the exported Model."""
    import numpy as np

    X, y, w = np.array(xs), np.array(ys), np.array(ws) * len(ws) / sum(ws)
    if form == "logistic":
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        sc = StandardScaler().fit(X)
        sd = np.where(sc.scale_ > 0, sc.scale_, 1.0)
        lr = LogisticRegression(C=1.0, max_iter=5000).fit((X - sc.mean_) / sd, y,
                                                          sample_weight=w)
        w = lr.coef_[0] / sd
        b = float(lr.intercept_[0] - np.sum(lr.coef_[0] * sc.mean_ / sd))
        return Model(names, {"kind": "logistic", "intercept": b,
                             "weights": [float(v) for v in w]})
    from sklearn.ensemble import GradientBoostingClassifier

    gb = GradientBoostingClassifier(n_estimators=150, max_depth=3, learning_rate=0.1,
                                    min_samples_leaf=20, subsample=0.8, random_state=0)
    gb.fit(X, y, sample_weight=w)
    prior = float(gb._raw_predict_init(X[:1])[0][0])
    trees = []
    for est in gb.estimators_[:, 0]:
        t = est.tree_
        trees.append({"feature": [int(v) for v in t.feature],
                      "threshold": [float(v) for v in t.threshold],
                      "left": [int(v) for v in t.children_left],
                      "right": [int(v) for v in t.children_right],
                      "value": [float(gb.learning_rate * v) for v in t.value[:, 0, 0]]})
    model = Model(names, {"kind": "trees", "base": prior, "trees": trees})
    # The exported arithmetic against the library's own, on a sample of the training steps.
    sample = X[:: max(1, len(X) // 500)]
    ours = np.array([model.p(list(r)) for r in sample])
    theirs = gb.predict_proba(sample)[:, 1]
    assert np.max(np.abs(ours - theirs)) < 1e-6, np.max(np.abs(ours - theirs))
    return model


def decide(steps, ps, n, a, b, waits):
    """The engine's score decisions for one run (`Engine::score_decision`): (request,
    action) for each intervention at a request the run makes (< n)."""
    out, level, last = [], 0, None  # level: 0 quiet, 1 reminded, 2 stopped
    for (k, working, human, recalled, hard, _), p in zip(steps, ps):
        req = k + 1
        if recalled and not human:
            continue
        if human:
            level, last = 0, None
        if level == 2 or human:
            continue
        if hard:
            action = "halt"
        elif level >= 1 and p >= b and (last is None or req >= last + GAP) \
                and not (waits and working):
            action = "halt"
        elif p >= a and (last is None or req >= last + COOLDOWN):
            action = "nudge" if level == 0 else "replan"
        else:
            continue
        level, last = (2 if action == "halt" else 1), req
        if req < n:
            out.append((req, action))
        if action == "halt":
            break  # the proxy holds a halted run (a human's word resumes it, not a replay)
    return out


class Corpus:
    def __init__(self, score, data, cache, binary):
        self.score = score
        self.runs, self.labels, self.steps, self.file_of, self.raw_labels = {}, {}, {}, {}, {}
        self.names = None
        for name in FILES:
            runs = score.load_runs(os.path.join(data, name + ".jsonl"))
            self.runs.update(runs)
            self.file_of.update({r: name for r in runs})
            lpath = os.path.join(data, name + "_labels.jsonl")
            self.labels.update(score.load_labels(lpath))
            for d in score.load_jsonl(lpath):
                self.raw_labels[d["id"]] = d
            steps, names = parse(explain(binary, data, cache, name))
            self.steps.update(steps)
            self.names = names
        self.agents = sorted({r["agent"] for r in self.runs.values()})

    def ids(self, agents):
        return [r for r, v in self.runs.items() if v["agent"] in agents and r in self.steps]

    def training(self, ids):
        """Features and labels of the labelled runs' steps, and each step's weight: 1, or
        with BALANCE each run's steps weigh 1 in all (a long loop counts as much as a
        short one)."""
        xs, ys, ws = [], [], []
        for r in ids:
            if r in self.raw_labels:
                steps = self.steps[r]
                xs += [s[5] for s in steps]
                ys += step_labels(steps, self.raw_labels[r])
                ws += [1.0 / max(1, len(steps)) if BALANCE else 1.0] * len(steps)
        return xs, ys, ws

    def per(self, decisions):
        return self.score.effective(decisions, self.runs)[0]

    def metrics(self, per, ids):
        return self.score.metrics(ids, self.runs, per, self.labels)


def probabilities(corpus, model, ids):
    return {r: [model.p(s[5]) for s in corpus.steps[r]] for r in ids}


def decisions(corpus, ps, ids, a, b, waits):
    out = []
    for r in ids:
        for req, action in decide(corpus.steps[r], ps[r], corpus.runs[r]["n"], a, b, waits):
            out.append({"id": r, "step": req, "action": action, "detector": "score"})
    return out


def choose(corpus, ps, ids):
    """Thresholds on the training runs: within the harm bounds (lost-fix, false-halt,
    resolved runs nudged), the most labelled loops caught, then the most steps saved."""
    best = None
    for waits in (True, False):
        for a in NUDGE_GRID:
            for b in STOP_GRID:
                if b < a:
                    continue
                m = corpus.metrics(corpus.per(decisions(corpus, ps, ids, a, b, waits)), ids)
                ok = (m["lost_fix"] or 0) <= MAX_LOST_FIX and \
                    (m["false_halt"] or 0) <= MAX_FALSE_HALT and \
                    (m["res_nudged"] or 0) <= MAX_RES_NUDGED
                key = (ok, round(m["recall"] or 0, 4), round(m["steps_saved"] or 0, 4),
                       -(m["res_nudged"] or 0))
                if best is None or key > best[0]:
                    best = (key, a, b, waits)
    return best[1], best[2], best[3]


def export(model, a, b, waits, path):
    with open(path, "w") as f:
        json.dump({"meaning": MEANING, "features": model.names, "form": model.form,
                   "nudge_at": a, "stop_at": b, "stop_waits": waits}, f, separators=(",", ":"))
        f.write("\n")


def reliability(pairs, bins=10):
    """(p, label) pairs -> rows (bin, steps, mean predicted, observed)."""
    rows = []
    for i in range(bins):
        lo, hi = i / bins, (i + 1) / bins
        sel = [(p, y) for p, y in pairs if lo <= p < hi or (i == bins - 1 and p == 1.0)]
        if sel:
            rows.append((f"{lo:.1f}-{hi:.1f}", len(sel), sum(p for p, _ in sel) / len(sel),
                         sum(y for _, y in sel) / len(sel)))
    return rows


def replay_family(binary, data, corpus, agent, model_path, work):
    """The family's runs replayed by the proxy deciding with `model_path`."""
    decisions = []
    for name in FILES:
        ids = {r for r in corpus.ids([agent]) if corpus.file_of[r] == name}
        if not ids:
            continue
        sub = os.path.join(work, f"{agent}-{name}.jsonl")
        with open(os.path.join(data, name + ".jsonl")) as f, open(sub, "w") as out:
            for line in f:
                if json.loads(line)["id"] in ids:
                    out.write(line)
        res = subprocess.run([binary, "replay", sub, "--score-model", model_path],
                             check=True, capture_output=True, text=True)
        decisions += [json.loads(x) for x in res.stdout.splitlines() if x.strip()]
    return decisions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--binary", default=os.path.join(target_dir, "eval", "loopwarden"))
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "trajectories"))
    ap.add_argument("--cache", default="/tmp/lw-score-cache")
    ap.add_argument("--form", choices=("logistic", "trees"), default="logistic")
    ap.add_argument("--replay", action="store_true",
                    help="replay each family with its held-out model and compare")
    ap.add_argument("--write", action="store_true",
                    help="write the model fitted on all families into src/detect")
    ap.add_argument("--max-res-nudged", type=float, default=0.10,
                    help="the bound on resolved runs nudged a choice of thresholds holds")
    ap.add_argument("--balance", action="store_true",
                    help="weigh each labelled run's steps 1 in all")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    global MAX_RES_NUDGED, BALANCE
    MAX_RES_NUDGED, BALANCE = a.max_res_nudged, a.balance
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import evaluate  # noqa: E402  (its tables)

    score = load_scorer()
    corpus = Corpus(score, a.data, a.cache, a.binary)
    work = os.path.join(a.cache, "models-" + a.form)
    os.makedirs(work, exist_ok=True)
    xs, ys, ws = corpus.training(corpus.ids(corpus.agents))
    print(f"{len(xs)} labelled steps, {sum(ys)} inside a loop; form {a.form}")

    held, pairs, chosen, mismatched = [], [], {}, 0
    for agent in corpus.agents:
        train = corpus.ids([g for g in corpus.agents if g != agent])
        test = corpus.ids([agent])
        model = fit(*corpus.training(train), corpus.names, a.form)
        nudge_at, stop_at, waits = choose(corpus, probabilities(corpus, model, train), train)
        chosen[agent] = (nudge_at, stop_at, waits)
        ps = probabilities(corpus, model, test)
        mine = decisions(corpus, ps, test, nudge_at, stop_at, waits)
        held += mine
        for r in test:
            if r in corpus.raw_labels:
                pairs += zip(ps[r], step_labels(corpus.steps[r], corpus.raw_labels[r]))
        path = os.path.join(work, agent + ".json")
        export(model, nudge_at, stop_at, waits, path)
        if a.replay:
            theirs = replay_family(a.binary, a.data, corpus, agent, path, work)
            got = sorted((d["id"], d["step"], d["action"]) for d in theirs)
            want = sorted((d["id"], d["step"], d["action"]) for d in mine)
            same = got == want
            mismatched += not same
            print(f"{agent}: the proxy's decisions {'equal' if same else 'DIFFER FROM'} "
                  f"the simulation's ({len(got)} interventions)")
    per = corpus.per(held)
    rows = [("all (held out)", corpus.metrics(per, corpus.ids(corpus.agents)))]
    rows += [(f"{g} (a={chosen[g][0]}, b={chosen[g][1] if chosen[g][1] <= 1 else 'never'}"
              f"{', waits' if chosen[g][2] else ''})", corpus.metrics(per, corpus.ids([g])))
             for g in corpus.agents]
    print("\nThe score, leave one family out (fitted and thresholded without the family):")
    print(evaluate.table(rows, a.markdown))

    ladder = []
    for name in FILES:
        ladder += score.load_jsonl(os.path.join(a.cache, name + ".ladder.jsonl"))
    lper = corpus.per(ladder)
    print("\nThe shipped ladder on the same runs:")
    print(evaluate.table([("all", corpus.metrics(lper, corpus.ids(corpus.agents)))] +
                         [(g, corpus.metrics(lper, corpus.ids([g]))) for g in corpus.agents],
                         a.markdown))

    print("\nReliability, held out (labelled steps, by predicted probability):")
    print("| predicted | steps | mean predicted | observed |\n|---|---:|---:|---:|")
    for b, n, mp, ob in reliability(pairs):
        print(f"| {b} | {n} | {mp:.3f} | {ob:.3f} |")
    if a.replay and mismatched:
        sys.exit(f"{mismatched} families decided differently by the proxy")

    if a.write:
        ids = corpus.ids(corpus.agents)
        model = fit(xs, ys, ws, corpus.names, a.form)
        nudge_at, stop_at, waits = choose(corpus, probabilities(corpus, model, ids), ids)
        export(model, nudge_at, stop_at, waits, MODEL)
        # A handful of steps spread over the probabilities, and what the script computed.
        ranked = sorted(range(len(xs)), key=lambda i: model.p(xs[i]))
        picks = [ranked[int(q * (len(ranked) - 1))] for q in (0, 0.2, 0.5, 0.8, 0.95, 0.99, 1)]
        with open(CHECKS, "w") as f:
            json.dump({"checks": [{"x": xs[i], "p": model.p(xs[i])} for i in picks]}, f)
            f.write("\n")
        print(f"\nwrote {MODEL} (nudge at {nudge_at}, stop at {stop_at}, "
              f"waits {waits}) and {CHECKS}")


if __name__ == "__main__":
    main()
