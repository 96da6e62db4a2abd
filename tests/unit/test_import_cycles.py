"""Dependencies run one way: no import cycle between the modules of the client (engram_episodic), shared
and services, and the client (the `engram-episodic` distribution) never imports the server.

The graph is static (`ast`, nothing imported) and takes every import a module can make: at the top,
inside functions (a lazy import still closes a cycle once both ends have run), under `if TYPE_CHECKING:`,
and a module's name as a literal argument of a call (`importlib.import_module("shared.settings")`, or
of a function that passes it on to it). Importing `a.b.c` runs the packages `a` and
`a.b` first, so an edge to a module is also one to each package above it, except the importer's own
packages (they run before it anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = {"engram_episodic": ROOT / "client", "shared": ROOT, "services": ROOT}
SERVER = ("shared", "services")


def _modules() -> dict[str, Path]:
    """Module name → file, for every module of the three packages (a package is its `__init__`)."""
    out = {}
    for top, base in TREES.items():
        for path in sorted((base / top).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "build" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _known(name: str, modules: set[str]) -> str | None:
    """`name`, or its longest prefix that is a module (`a.b.Thing` → `a.b`); None outside the three."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def _named(module: str, path: Path, tree: ast.Module, modules: set[str]) -> set[str]:
    """Every dotted name `module` (at `path`) imports, relative imports resolved; a string argument of
    a call counts when it is the name of one of `modules`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from a import b` runs `a`, and imports the module `a.b` when there is one
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call):
            names |= {
                arg.value
                for arg in node.args
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in modules
            }
    return names


def _graph() -> dict[str, set[str]]:
    """Module → the modules of the three packages it imports (with the packages above them)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        deps: set[str] = set()
        for imported in _named(name, path, ast.parse(path.read_text(encoding="utf-8")), known):
            target = _known(imported, known)
            while target:
                deps.add(target)
                target = target.rpartition(".")[0]
        graph[name] = {d for d in deps if d in known and d != name and d not in own}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _path(graph: dict[str, set[str]], component: list[str]) -> str:
    """One cycle through the first module of `component`, as `a → b → a`."""
    members, start = set(component), component[0]
    trail, seen = [start], {start}
    while True:
        nxt = sorted(graph[trail[-1]] & members)
        if start in nxt:
            return " → ".join([*trail, start])
        step = next((n for n in nxt if n not in seen), None)
        if step is None:  # a branch off the cycle: the component still has one
            return " ↔ ".join(component)
        trail.append(step)
        seen.add(step)


def test_no_import_cycle_between_modules():
    graph = _graph()
    assert {"engram_episodic.cli", "shared.settings", "services.run"} <= set(graph)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_path(graph, c) for c in cycles)


def test_the_client_never_imports_the_server():
    graph = _graph()
    wrong = {
        f"{name} → {dep}"
        for name, deps in graph.items()
        if name.split(".")[0] == "engram_episodic"
        for dep in deps
        if dep.split(".")[0] in SERVER
    }
    assert not wrong, "the client imports the server:\n" + "\n".join(sorted(wrong))


def test_the_graph_sees_lazy_and_string_imports_and_finds_cycles():
    source = (
        "def f():\n    from shared import settings\n    importlib.import_module('services.run')\n"
        "    server_module('replay', 'services.consolidator.replay')\n    print('services.nothing')\n"
    )
    modules = {"services.run", "services.consolidator.replay"}
    names = _named("engram_episodic.x", ROOT / "x.py", ast.parse(source), modules)
    assert {"shared.settings", "services.run", "services.consolidator.replay"} <= names
    assert "services.nothing" not in names
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _path({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"]) == "a → b → c → a"
