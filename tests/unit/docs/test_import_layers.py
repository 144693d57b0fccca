"""The import graph of the daemon (speaker/nocloudlb) and the shared core (plugins/module_utils,
packaged as nocloudlb.core) stays layered: no circle, however lazy the import (one inside a
function counts too), the core imports nothing of the daemon, and nothing imports the daemon's
top (daemon, cli) but the entry points."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
COLLECTION_PREFIX = "ansible_collections.nocloud.loadbalancer.plugins.module_utils"
TOP = {"nocloudlb.daemon", "nocloudlb.cli"}
ENTRY_POINTS = {"nocloudlb.cli", "nocloudlb.__main__"}


def modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "speaker" / "nocloudlb").rglob("*.py"):
        parts = list(path.relative_to(ROOT / "speaker").with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "plugins" / "module_utils").glob("*.py"):
        out["nocloudlb.core" + ("" if path.stem == "__init__" else "." + path.stem)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that ``name`` imports, at any depth of its code."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            target = target.replace(COLLECTION_PREFIX, "nocloudlb.core")
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name.replace(COLLECTION_PREFIX, "nocloudlb.core") for a in node.names]
        found |= {t for t in targets if t in known and t != name}
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_finder_sees_a_circle_through_a_lazy_import():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(g) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_relative_lazy_and_collection_imports():
    g = graph()
    assert "nocloudlb.core.healthcheck" in g["nocloudlb.core.backends"]
    assert "nocloudlb.core.backends" in g["nocloudlb.core.schema"]
    assert "nocloudlb.daemon" in g["nocloudlb.cli"]


def test_no_module_imports_itself_back_through_others():
    assert circles(graph()) == []


def test_the_core_imports_nothing_of_the_daemon():
    upward = {(name, dep) for name, deps in graph().items() if name.startswith("nocloudlb.core")
              for dep in deps if not dep.startswith("nocloudlb.core")}
    assert upward == set()


def test_only_the_entry_points_import_the_daemons_top():
    upward = {(name, dep) for name, deps in graph().items() for dep in deps & TOP if name not in ENTRY_POINTS}
    assert upward == set()
