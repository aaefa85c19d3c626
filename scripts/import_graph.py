#!/usr/bin/env python3
"""The library's file-level import graph, its cycles, and its long functions.

Reads src/**/*.rs (the library crate rooted at src/lib.rs; src/main.rs is the binary and
reaches the library as `loopwarden::`, so it is left out) and draws an edge from a file to
every file whose module it names:

  * `use` trees: `use crate::a::{b::C, d}`, `use super::x`, `use self::y`, and relative
    `use child::Z` where `child` is a submodule declared in the file;
  * paths in the code: `crate::a::b::f()`, `super::x::Y`, `child::Z`.

A path resolves to the longest prefix that is a module with a file (`crate::policy::Mode`
names src/policy/mod.rs, `crate::policy::live::Live` names src/policy/live.rs). `mod child;`
declarations are not edges: a parent only depends on a child when it uses something of it.
Comments, strings and `#[cfg(test)]` items are skipped (unless --tests), so doc links and
test helpers do not count.

Prints the strongly connected components with more than one file (the cycles), those
across top-level modules first (a parent module and its children that use each other,
`detect/mod.rs` and `detect/engine.rs`, is the usual Rust shape and is told apart), with
the edges inside each and the paths that make them (--edges); and, with --long N, every
function in src/ longer than N lines (from its `fn` line to its closing brace). Exits 1
when a cycle crosses top-level modules.

Usage: scripts/import_graph.py [--root DIR] [--edges] [--tests] [--long N] [--modules]
  --modules  collapse files to top-level modules (src/proxy/** -> proxy) before the SCCs
"""

import argparse
import os
import re
import sys
from collections import defaultdict


def strip_code(text):
    """Replaces comments, string and char literals with spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(br|rb|r|b)(#*)"', text[i:])
            if m and "r" in m.group(1):
                end = '"' + m.group(2)
                j = text.find(end, i + m.end())
                j = n if j < 0 else j + len(end)
                out.append(blank(text[i:j]))
                i = j
            elif m:  # b"..."
                out.append(" ")
                i += 1
            elif c == "b" and nxt == "'":
                out.append(" ")
                i += 1
            else:
                out.append(c)
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if nxt == "\\":
                j = text.find("'", i + 3 if text[i + 2 : i + 3] == "'" else i + 2)
                j = n if j < 0 else j + 1
                out.append(blank(text[i:j]))
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                out.append("   ")
                i += 3
            elif nxt and ord(nxt) > 127:
                # a multi-byte char literal such as '→'
                j = text.find("'", i + 1)
                j = n if j < 0 else j + 1
                out.append(blank(text[i:j]))
                i = j
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*([{;])")


def drop_test_items(code):
    """Blanks `#[cfg(test)] mod x { ... }` blocks (keeping newlines)."""
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code
        end = m.end() if m.group(1) == ";" else matching_brace(code, m.end() - 1) + 1
        code = code[: m.start()] + re.sub(r"[^\n]", " ", code[m.start() : end]) + code[end:]


def split_top(s, sep=","):
    parts, depth, cur = [], 0, []
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use(tree, prefix=()):
    """`a::{b::C, d as E, self}` -> [(a,b,C), (a,d), (a,)]."""
    tree = re.sub(r"\s+", "", tree.replace(" as ", "@")) if " as " in tree else re.sub(r"\s+", "", tree)
    tree = re.sub(r"@\w+", "", tree)
    if tree.startswith("::"):
        tree = tree[2:]
    brace = tree.find("{")
    if brace < 0:
        segs = [s for s in tree.split("::") if s]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        if segs and segs[-1] == "*":
            segs = segs[:-1]
        return [prefix + tuple(segs)]
    head = [s for s in tree[:brace].split("::") if s]
    inner = tree[brace + 1 : tree.rfind("}")]
    out = []
    for part in split_top(inner):
        out.extend(expand_use(part, prefix + tuple(head)))
    return out


def module_of(rel):
    """src/a/b.rs -> (a, b); src/a/mod.rs -> (a,); src/lib.rs -> ()."""
    parts = rel[len("src/") : -len(".rs")].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def load(root, tests):
    files = {}
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        for name in names:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel == "src/main.rs" or rel.startswith("src/bin/"):
                continue
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
            code = strip_code(text)
            files[rel] = (text, code if tests else drop_test_items(code))
    return files


def resolve(path, here, modules):
    """A path's segments, as written in the module `here`, to the file of the longest
    module prefix, or None for another crate."""
    segs = list(path)
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif tuple(here) + (segs[0],) in modules:
        base = list(here)
    else:
        return None
    full = base + segs
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in modules:
            return modules[tuple(full[:k])]
    return None


USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::(?:super|[A-Za-z_]\w*))+)")


def graph(files):
    modules = {module_of(rel): rel for rel in files}
    edges = defaultdict(lambda: defaultdict(set))  # from -> to -> {paths}
    for rel, (_, code) in files.items():
        here = module_of(rel)
        paths = []
        for m in USE.finditer(code):
            paths.extend(expand_use(m.group(1)))
        body = USE.sub(lambda m: " " * len(m.group(0)), code)
        for m in PATH.finditer(body):
            paths.append(tuple(m.group(1).split("::")))
        for p in paths:
            target = resolve(p, here, modules)
            if target and target != rel:
                edges[rel][target].add("::".join(p))
    return edges


def sccs(nodes, succ):
    """Tarjan's algorithm, iterative."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(succ.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


FN = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern\s+\"\w+\")\s+)*fn\s+(\w+)", re.M)


def long_functions(files, limit):
    out = []
    for rel, (_, code) in files.items():
        for m in FN.finditer(code):
            # The body opens at the first `{` after the signature, unless a `;` ends it first.
            j = m.end()
            depth = 0
            while j < len(code):
                c = code[j]
                if c in "(<[":
                    depth += 1
                elif c in ")>]":
                    depth -= 1 if c != ">" or code[j - 1] != "-" else 0
                elif c == ";" and depth <= 0:
                    j = -1
                    break
                elif c == "{" and depth <= 0:
                    break
                j += 1
            if j < 0 or j >= len(code):
                continue
            end = matching_brace(code, j)
            first = code.count("\n", 0, m.start()) + 1
            last = code.count("\n", 0, end) + 1
            if last - first + 1 > limit:
                out.append((last - first + 1, rel, first, m.group(1)))
    return sorted(out, reverse=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--edges", action="store_true", help="print each cycle's edges and paths")
    ap.add_argument("--tests", action="store_true", help="count #[cfg(test)] modules too")
    ap.add_argument("--modules", action="store_true", help="collapse to top-level modules")
    ap.add_argument("--long", type=int, metavar="N", help="list functions over N lines")
    args = ap.parse_args()

    files = load(os.path.abspath(args.root), args.tests)
    edges = graph(files)
    if args.modules:
        top = lambda rel: (module_of(rel) or ("lib",))[0]
        collapsed = defaultdict(lambda: defaultdict(set))
        for a, tos in edges.items():
            for b, paths in tos.items():
                if top(a) != top(b):
                    collapsed[top(a)][top(b)] |= paths
        edges = collapsed
        nodes = {top(rel) for rel in files}
    else:
        nodes = set(files)
    succ = {a: set(tos) for a, tos in edges.items()}
    cycles = [c for c in sccs(nodes, succ) if len(c) > 1]
    unit = "modules" if args.modules else "files"
    top = lambda node: node if args.modules else (module_of(node) or ("lib",))[0]
    across = [c for c in cycles if len({top(n) for n in c}) > 1]
    print(f"{len(nodes)} {unit}, {sum(len(t) for t in succ.values())} edges, "
          f"{len(cycles)} cycle(s) (strongly connected components of more than one), "
          f"{len(across)} across top-level modules")
    for comp in sorted(cycles, key=lambda c: (c not in across, -len(c))):
        mods = sorted({top(n) for n in comp})
        where = (f"across modules {', '.join(mods)}" if len(mods) > 1
                 else f"within {mods[0]}: a parent and its children")
        print(f"\n{len(comp)} {unit}, {where}:")
        members = set(comp)
        for a in comp:
            inside = sorted(b for b in succ.get(a, ()) if b in members)
            print(f"  {a} -> {', '.join(inside)}")
            if args.edges:
                for b in inside:
                    print(f"      {b}: {', '.join(sorted(edges[a][b]))}")
    if args.long is not None:
        found = long_functions(files, args.long)
        print(f"\nfunctions over {args.long} lines: {len(found)}")
        for length, rel, line, name in found:
            print(f"  {length:4} {rel}:{line} {name}")
    return 1 if across else 0


if __name__ == "__main__":
    sys.exit(main())
