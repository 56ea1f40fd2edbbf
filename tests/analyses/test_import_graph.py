"""Imports point one way: commands (gaptrace/analyze.py, diff.py, cli.py, report/) -> analyses -> trace model; no
import cycle among the modules of gaptrace/ and analyses/, counting imports inside functions too (a lazy import
hides a cycle from Python, not from a reader). Read off the source with ``ast``; nothing is imported."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# the trace model and the helpers below the analyses: they import nothing above them
TRACE_MODEL = {"gaptrace", "gaptrace.trace", "gaptrace.loader", "gaptrace.reference", "gaptrace.eventcols", "gaptrace.eventscan",
               "gaptrace.decodepool", "gaptrace.jsonstream", "gaptrace.sidecar", "gaptrace.text", "gaptrace.outputs", "gaptrace.bounds"}
ABOVE_ANALYSES = ("gaptrace.cli", "gaptrace.analyze", "gaptrace.diff", "gaptrace.report", "gaptrace.capture",
                  "gaptrace.runtime", "torch")


def _modules() -> dict[str, str]:
    """{dotted name: file} for gaptrace/ (as gaptrace.*) and analyses/ (installed as gaptrace.analyses.*)."""
    out = {}
    for folder, pkg in (("gaptrace", "gaptrace"), ("analyses", "gaptrace.analyses")):
        base = os.path.join(ROOT, folder)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                    rel = "" if rel == "__init__" else rel.removesuffix(".__init__")
                    out[pkg + ("." + rel if rel else "")] = os.path.join(dirpath, f)
    return out


def _imports(name: str, path: str) -> set[str]:
    """Every module ``name`` imports anywhere in its file (absolute dotted names; ``from X import y`` gives X and
    X.y)."""
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = (name if is_pkg else name.rsplit(".", 1)[0]).split(".")
                target = ".".join(parts[:len(parts) - node.level + 1]) + (f".{node.module}" if node.module else "")
            else:
                target = node.module
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    raw = {m: _imports(m, p) for m, p in mods.items()}
    graph = {}
    for m, targets in raw.items():
        deps = set()
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != m:
                deps.add(t)
        graph[m] = deps
    return graph, raw


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop(); on.discard(x); comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph, _ = _graph()
    assert len(graph) > 30 and "gaptrace.analyses.summary" in graph and "gaptrace.reference" in graph
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_analyses_and_trace_model_import_nothing_above_them():
    graph, raw = _graph()
    bad = {}
    for m, targets in raw.items():
        if m.startswith("gaptrace.analyses") or m in TRACE_MODEL:
            hits = sorted(t for t in targets if any(t == a or t.startswith(a + ".") for a in ABOVE_ANALYSES))
            if m in TRACE_MODEL:
                hits += sorted(t for t in graph[m] if t not in TRACE_MODEL)
            if hits:
                bad[m] = hits
    assert bad == {}
