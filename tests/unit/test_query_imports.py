"""The query service imports in one direction: parsed with `ast`, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "services.query"
APPKEYS = "services.query.appkeys"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "services" / "query").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str], *, typing: bool) -> set[str]:
    """The services.query modules `path` imports; with `typing`, also those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    if not typing:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _type_checking(node):
                skip |= {id(n) for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from services.query import recall` imports the module services.query.recall
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(PACKAGE):
                # `import services.query.views.facts` also runs services.query.views: the longest known prefix
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in modules:
                    found.add(name)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)), (
        f"{path}: relative import"
    )
    return found


def _graph(*, typing: bool) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        # a package's own `__init__` is no edge: importing services.query.views.x runs it first anyway
        graph[name] = {
            m for m in _imports(path, known, typing=typing) if m != name and not name.startswith(m + ".")
        }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_import_graph_of_the_query_service_has_no_cycle():
    graph = _graph(typing=True)  # TYPE_CHECKING imports included: no cycle even for the type checker
    assert APPKEYS in graph and "services.query.routes" in graph
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


def test_the_app_keys_module_imports_nothing_from_the_query_service():
    assert _graph(typing=False)[APPKEYS] == set()


def test_the_app_imports_the_route_table_and_no_module_imports_inside_a_function():
    graph = _graph(typing=False)
    assert "services.query.routes" in graph["services.query.app"]
    assert "services.query.app" not in set().union(
        *(deps for name, deps in graph.items() if name != "services.query.__main__")
    )
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = [n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
                assert not inner, f"{name}.{fn.name} imports at call time (line {inner[0].lineno})"


def test_the_cycle_check_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# Redis commands a module of the query service sends itself (a method of a connection or pipeline),
# and RediSearch commands (`FT.` strings): only their owners send them (the episode store, the
# recall's arms, the cursor secret's own); every other module goes through one, or `shared`
REDIS_COMMANDS = frozenset(
    "hget hmget hgetall hset hexists hincrby exists eval evalsha execute_command xrange xadd "
    "delete unlink pipeline register_script".split()
)
OWNERS = {
    "services.query.store": REDIS_COMMANDS | {"FT."},
    "services.query.recall.arms": {"execute_command", "pipeline", "FT."},
}


def _raw_redis(path: Path) -> list[tuple[int, str]]:
    """(line, command) of each Redis command method called and each `FT.` string in `path` ("FT.")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in REDIS_COMMANDS:
                found.append((node.lineno, node.func.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("FT."):
            found.append((node.lineno, "FT."))
    return sorted(found)


def test_redis_and_redisearch_commands_are_sent_by_their_owners_only():
    for name, path in _modules().items():
        stray = [(line, cmd) for line, cmd in _raw_redis(path) if cmd not in OWNERS.get(name, ())]
        assert not stray, f"{name} sends Redis commands itself (the owners: {sorted(OWNERS)}): {stray}"


def test_the_owner_check_finds_a_raw_call(tmp_path: Path):
    path = tmp_path / "view.py"
    path.write_text(
        'async def f(r):\n    await r.hget("k", "doc")\n    await r.execute_command("FT.SEARCH", "i")\n'
    )
    assert _raw_redis(path) == [(2, "hget"), (3, "FT."), (3, "execute_command")]
