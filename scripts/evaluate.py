#!/usr/bin/env python3
"""Detection on the recorded runs: figures, leave-one-agent-out, renamed tools, the CI gate.

Replays the recorded runs of ../shared/data/trajectories (`dev`, `dev2`, `fresh`, `cc`, `tb`:
seven agent families, named by each run's `agent` field) through `loopwarden replay` and scores
the decisions with the reference scorer (../shared/eval/score.py), the files pooled,
overall, per file and per agent family (EVALUATION.md says what each figure means).

    scripts/evaluate.py                       # figures of the shipped config
    scripts/evaluate.py --loao                # + leave-one-agent-out over the settings grid
    scripts/evaluate.py --renamed             # + the same runs with every tool renamed
    scripts/evaluate.py --cases               # + the runs behind the harm and the misses
    scripts/evaluate.py --gate                # exit 1 outside the CI gate (GATE_* below)
    scripts/evaluate.py --files dev,cc        # only these files

Leave-one-agent-out: every variant of GRID (the shipped config and a few global settings
around it, never a setting per agent) is replayed once; for each family, the variant is
chosen on the other six families' runs alone, and that family's runs are scored with it.
Pooled, those are the figures to expect on an agent nobody tuned for.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
FILES = ("dev", "dev2", "fresh", "cc", "tb")

# The CI gate, on all five files pooled: the harm users feel (lost-fix), a recall floor set
# just under what the shipped config reaches (82.9% of 140 labelled loops: a change that
# loses two loops fails), a ceiling on resolved runs nudged just over it (14.2% of 887: a
# change that nudges seven more fails), and a floor on the frontier runs' loops (tb: 66.7%
# of 24; a change that loses one of them fails).
GATE_LOST_FIX = 0.01
GATE_RECALL = 0.82
GATE_RES_NUDGED = 0.15
GATE_TB_RECALL = 0.65
# Targets of the detection issue (per family and by leave-one-agent-out), reported.
TARGET = {"lost_fix": 0.01, "res_nudged": 0.10, "recall": 0.85, "prec": 0.85, "steps_saved": 0.10}

# The settings grid for leave-one-agent-out: config files layered on the shipped defaults.
GRID = {
    "shipped": "",
    "quiet4": "[detect.escalation]\nstop_after_quiet = 4\n",
    "quiet8": "[detect.escalation]\nstop_after_quiet = 8\n",
    "gap3": "[detect.escalation]\nescalation_gap = 3\n",
    "streak4": "[detect.thresholds]\nstagnation_streak = 4\n",
    "dead_end6": "[detect.thresholds]\ndead_end_steps = 6\n",
    "pileup8": "[detect.thresholds]\npileup_errors = 8\n",
    "fail_loop4": "[detect.thresholds]\nfail_loop_runs = 4\n",
    "near_dup07": "[detect.thresholds]\nnear_dup_similarity = 0.7\n",
    "new_output_counts": "[detect.thresholds]\nstagnation_new_output_holds = false\n",
    "obstacle_nudge": "[detect.patterns.obstacle_stall]\nresponse = \"nudge\"\n",
    "obstacle_off": "[detect.patterns.obstacle_stall]\nresponse = \"off\"\n",
    "meetings5": "[detect.thresholds]\nobstacle_meetings = 5\n",
    "stretch_on": "[detect.thresholds]\nobstacle_steps = 5\n",
    "resend_nudge": "[detect.patterns.resend]\nresponse = \"nudge\"\n",
    "no_obstacle_stop": "[detect.escalation]\nstop_on_obstacle = false\n",
    "restarts_off": "[detect.thresholds]\nobstacle_restarts = 0\n",
}


def load_scorer():
    sys.path.insert(0, os.path.join(SHARED, "eval"))
    import score  # noqa: E402  (the reference scorer, beside the data)

    return score


def replay(binary, trajectories, config_path, out_path):
    """Replays one file (with a config file, if any); decisions go to out_path."""
    args = [binary, "replay", trajectories] + (["--config", config_path] if config_path else [])
    with open(out_path, "w") as out:
        subprocess.run(args, stdout=out, check=True)


class Corpus:
    """The files' runs and labels, pooled."""

    def __init__(self, score, data, files):
        self.score = score
        self.names = list(files)
        self.files = [os.path.join(data, f + ".jsonl") for f in files]
        self.runs, self.labels, self.file_of = {}, {}, {}
        for name, path in zip(files, self.files):
            runs = score.load_runs(path)
            clash = set(runs) & set(self.runs)
            if clash:
                sys.exit(f"{path}: run ids already read from another file: {sorted(clash)[:3]}")
            self.runs.update(runs)
            self.file_of.update({r: name for r in runs})
            self.labels.update(score.load_labels(os.path.join(data, name + "_labels.jsonl")))
        self.agents = sorted({r["agent"] for r in self.runs.values()})
        self.raw = {}  # tag -> the replay's decisions, as printed

    def decide(self, binary, config_text, workdir, tag, files=None):
        """Replays every file (or `files`, the same runs rewritten) with a config; the
        effective decisions per run."""
        config_path = None
        if config_text:
            config_path = os.path.join(workdir, tag + ".toml")
            with open(config_path, "w") as f:
                f.write(config_text)
        decisions = []
        for i, path in enumerate(files or self.files):
            out = os.path.join(workdir, f"{tag}-{i}.jsonl")
            replay(binary, path, config_path, out)
            decisions += self.score.load_jsonl(out)
        self.raw[tag] = decisions
        per, _ = self.score.effective(decisions, self.runs)
        return per

    def metrics(self, per, ids=None):
        ids = list(self.runs) if ids is None else ids
        return self.score.metrics(ids, self.runs, per, self.labels)

    def ids_of(self, agents):
        return [r for r, v in self.runs.items() if v["agent"] in agents]

    def ids_in(self, name):
        return [r for r in self.runs if self.file_of[r] == name]


COLUMNS = [("runs", "runs", "int"), ("res", "res", "int"), ("unres", "unres", "int"),
           ("false_halt", "false-halt", "pct"), ("lost_fix", "lost-fix", "pct"),
           ("res_nudged", "res-nudged", "pct"), ("unres_halted", "unres-halted", "pct"),
           ("steps_saved", "steps-saved", "pct"), ("loops", "loops", "int"),
           ("recall", "recall", "pct"), ("prec", "prec", "pct"),
           ("med_delay", "med-delay", "num")]


def table(rows, markdown):
    """rows: [(label, metrics)]."""
    def cell(m, key, kind):
        v = m.get(key)
        if v is None:
            return "-"
        if kind == "pct":
            return "%.1f%%" % (100 * v)
        if kind == "num":
            return ("%d" % v) if float(v).is_integer() else ("%.1f" % v)
        return str(v)

    head = ["group"] + [c[1] for c in COLUMNS]
    body = [[label] + [cell(m, k, kind) for k, _, kind in COLUMNS] for label, m in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(COLUMNS) + "|"]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(r, widths))) for r in [head] + body)


def by_agent(corpus, per):
    rows = [("all", corpus.metrics(per))]
    rows += [(a, corpus.metrics(per, corpus.ids_of([a]))) for a in corpus.agents]
    return rows


def by_file(corpus, per):
    return [(n, corpus.metrics(per, corpus.ids_in(n))) for n in corpus.names]


def choice_key(m):
    """How a variant ranks on the runs it is chosen on: a variant that holds every target
    (lost-fix, resolved nudged, recall) first, by the steps it saves; else harm first: the
    least fix lost, then the fewest resolved runs nudged, then the most loops caught."""
    feasible = (m["lost_fix"] or 0) <= TARGET["lost_fix"] and \
        (m["res_nudged"] or 0) <= TARGET["res_nudged"] and \
        (m["recall"] or 0) >= TARGET["recall"]
    if feasible:
        return (True, m["steps_saved"] or 0, 0, 0, 0)
    return (False, 0, -(m["lost_fix"] or 0), -(m["res_nudged"] or 0), m["recall"] or 0)


def leave_one_agent_out(corpus, binary, workdir, markdown, variants=None):
    grid = {n: t for n, t in GRID.items() if variants is None or n in variants}
    pers = {name: corpus.decide(binary, text, workdir, name) for name, text in grid.items()}
    chosen, pooled = {}, {}
    for agent in corpus.agents:
        others = corpus.ids_of([a for a in corpus.agents if a != agent])
        best = max(grid, key=lambda n: choice_key(corpus.metrics(pers[n], others)))
        chosen[agent] = best
        for rid in corpus.ids_of([agent]):
            if rid in pers[best]:
                pooled[rid] = pers[best][rid]
    rows = [("all (held out)", corpus.metrics(pooled))]
    rows += [(f"{a} ({chosen[a]})", corpus.metrics(pooled, corpus.ids_of([a])))
             for a in corpus.agents]
    print("\nLeave one agent out (variant chosen on the other agents' runs):")
    print(table(rows, markdown))
    print("\nEvery variant, all runs:")
    print(table([(n, corpus.metrics(p)) for n, p in pers.items()], markdown))


# Renamed tools: what another agent with the same habits would send. Every tool of the six
# families gets a name no profile knows, and its arguments other keys.
RENAMES = {
    # SWE-agent, CodeR, mini-swe-agent, OpenHands
    "bash": "exec", "execute_bash": "run_command", "open": "view_file", "goto": "jump_to",
    "scroll_down": "page_down", "scroll_up": "page_up", "search_dir": "grep_dir",
    "search_file": "grep_file", "find_file": "locate_file", "create": "new_file",
    "edit": "replace_lines", "submit": "done", "finish": "complete",
    # OpenClaw (its `edit` takes a path and a list of edits: `replace_lines` too)
    "exec": "shell_run", "read": "view", "write": "save_file", "process": "job",
    # Claude Code
    "Bash": "terminal_exec", "Read": "open_file", "Write": "put_file", "Edit": "patch_file",
    "MultiEdit": "patch_many", "Grep": "find_text", "Glob": "match_paths", "LS": "list_dir",
    "BashOutput": "job_output", "TodoWrite": "todo",
}
EDITOR = {"view": "read", "create": "write", "str_replace": "edit", "insert": "insert_text",
          "undo_edit": "undo"}
REKEY = {"path": "file", "old_str": "oldText", "new_str": "newText", "file_text": "content",
         "view_range": "lines", "insert_line": "at_line", "command": "cmd",
         "replacement_text": "replacement", "search_term": "query", "file_name": "name",
         "file_path": "target", "old_string": "before", "new_string": "after",
         "content": "body", "pattern": "expr", "edits": "changes", "oldText": "find",
         "newText": "replace_with"}


def rekey(v):
    """Re-keys a value's objects, nested ones too (OpenClaw's list of edits)."""
    if isinstance(v, dict):
        return {REKEY.get(k, k): rekey(x) for k, x in v.items()}
    if isinstance(v, list):
        return [rekey(x) for x in v]
    return v


def renamed_call(fn):
    args = fn.get("arguments") or "{}"
    try:
        a = json.loads(args)
    except ValueError:
        a = None
    name = fn.get("name", "")
    if name == "str_replace_editor" and isinstance(a, dict):
        name = EDITOR.get(a.pop("command", ""), "editor")
    else:
        name = RENAMES.get(name, name)
    if isinstance(a, dict):
        args = json.dumps(rekey(a))
    return {"name": name, "arguments": args}


def renamed_tool(tool):
    """A tool definition under its new name, its parameters re-keyed: what the agent that
    sends the renamed calls would declare."""
    fn = tool.get("function") or {}
    name = fn.get("name", "")
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    fn = dict(fn, name=RENAMES.get(name, name), parameters=dict(
        params, properties={REKEY.get(k, k): v for k, v in props.items()},
        required=[REKEY.get(k, k) for k in params.get("required") or []]))
    return dict(tool, function=fn)


def rename_file(src, dst):
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            r = json.loads(line)
            r["tools"] = [renamed_tool(t) for t in r.get("tools") or []]
            for m in r["messages"]:
                for tc in m.get("tool_calls") or []:
                    tc["function"] = renamed_call(tc["function"])
            out.write(json.dumps(r) + "\n")


def cases(corpus, tag, per, markdown):
    """The runs behind the figures: resolved runs halted before a later fix, resolved runs
    nudged, labelled loops missed and labelled non-loops flagged, each with the detector
    and step of its first intervention (what `loopwarden replay --explain ID` shows)."""
    first = {}
    for d in corpus.raw[tag]:
        if d.get("action") in ("observe",):
            continue
        rid = d["id"]
        if rid not in first or d["step"] < first[rid]["step"]:
            first[rid] = d

    def line(rid, extra=""):
        d = first.get(rid)
        what = f"{d['action']} at {d['step']} by {d['detector']}" if d else "nothing"
        r = corpus.runs[rid]
        return f"  {corpus.file_of[rid]}  {rid}  ({what}; {r['n']} steps{extra})"

    for agent in corpus.agents:
        ids = corpus.ids_of([agent])
        lost = [r for r in ids if corpus.runs[r]["resolved"] is True and r in per
                and per[r]["halt"] is not None
                and any(e >= per[r]["halt"] for e in corpus.runs[r]["edits"])]
        nudged = [r for r in ids if corpus.runs[r]["resolved"] is True and r in per
                  and (per[r]["nudges"] or per[r]["halt"] is not None) and r not in lost]
        loops = [r for r in ids if r in corpus.labels and corpus.labels[r]["loop"]]
        missed = []
        for r in loops:
            onset = corpus.labels[r]["onset"]
            p = per.get(r, {"nudges": [], "halt": None})
            steps = list(p["nudges"]) + ([p["halt"]] if p["halt"] is not None else [])
            if not any(k >= onset for k in steps):
                missed.append((r, onset))
        false = [r for r in ids if r in corpus.labels and not corpus.labels[r]["loop"]
                 and r in per and (per[r]["nudges"] or per[r]["halt"] is not None)]
        print(f"\n## {agent}")
        print(f"lost a fix ({len(lost)}):")
        for r in lost:
            print(line(r))
        print(f"resolved, nudged or halted after the last fix ({len(nudged)}):")
        for r in nudged:
            print(line(r))
        print(f"labelled loops missed ({len(missed)} of {len(loops)}):")
        for r, onset in missed:
            print(line(r, f"; onset {onset}"))
        print(f"labelled non-loops flagged ({len(false)}):")
        for r in false:
            print(line(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--binary", default=os.path.join(target_dir, "eval", "loopwarden"))
    ap.add_argument("--data", default=os.path.join(SHARED, "data", "trajectories"))
    ap.add_argument("--files", default=",".join(FILES),
                    help="comma-separated files of --data to replay (default: all five)")
    ap.add_argument("--config", help="a config file layered on the defaults (to try a setting)")
    ap.add_argument("--loao", action="store_true", help="leave-one-agent-out over GRID")
    ap.add_argument("--variants", help="comma-separated names of GRID to choose among (default: all)")
    ap.add_argument("--renamed", action="store_true", help="also replay with tools renamed")
    ap.add_argument("--cases", action="store_true", help="list the harm and the misses")
    ap.add_argument("--gate", action="store_true", help="fail below the CI gate")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()

    score = load_scorer()
    corpus = Corpus(score, a.data, [f for f in a.files.split(",") if f])
    config_text = open(a.config).read() if a.config else ""
    with tempfile.TemporaryDirectory() as work:
        per = corpus.decide(a.binary, config_text, work, "shipped")
        print(("Config " + a.config if a.config else "Shipped config") + ", per file:")
        print(table(by_file(corpus, per) + [("all", corpus.metrics(per))], a.markdown))
        print("\nPer agent family:")
        print(table(by_agent(corpus, per), a.markdown))
        if a.cases:
            cases(corpus, "shipped", per, a.markdown)
        if a.renamed:
            renamed = []
            for path in corpus.files:
                dst = os.path.join(work, "renamed-" + os.path.basename(path))
                rename_file(path, dst)
                renamed.append(dst)
            rper = corpus.decide(a.binary, config_text, work, "renamed", renamed)
            print("\nThe same runs, every tool renamed and its arguments re-keyed:")
            print(table(by_agent(corpus, rper), a.markdown))
            same = sum(1 for r in corpus.runs if per.get(r) == rper.get(r))
            print(f"runs with the same decisions: {same} of {len(corpus.runs)}")
        if a.loao:
            variants = set(a.variants.split(",")) if a.variants else None
            leave_one_agent_out(corpus, a.binary, work, a.markdown, variants)
        if a.gate:
            m = corpus.metrics(per)
            tb = corpus.metrics(per, corpus.ids_in("tb")) if "tb" in corpus.names else None
            ok = (m["lost_fix"] or 0) <= GATE_LOST_FIX and (m["recall"] or 0) >= GATE_RECALL \
                and (m["res_nudged"] or 0) <= GATE_RES_NUDGED \
                and (tb is None or (tb["recall"] or 0) >= GATE_TB_RECALL)
            print(f"\ngate ({', '.join(corpus.names)}): lost-fix "
                  f"{100 * (m['lost_fix'] or 0):.1f}% (at most {100 * GATE_LOST_FIX:.0f}%), "
                  f"labelled-loop recall {100 * (m['recall'] or 0):.1f}% (at least "
                  f"{100 * GATE_RECALL:.0f}%), resolved runs nudged "
                  f"{100 * (m['res_nudged'] or 0):.1f}% (at most {100 * GATE_RES_NUDGED:.0f}%)"
                  + (f", tb recall {100 * (tb['recall'] or 0):.1f}% (at least "
                     f"{100 * GATE_TB_RECALL:.0f}%)" if tb else "") + ": "
                  + ("passed" if ok else "FAILED"))
            if not ok:
                sys.exit(1)


if __name__ == "__main__":
    main()
